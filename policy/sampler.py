"""Samplers: prompts -> G completions each, with token ids and per-token logprobs.

Invariants:
- Prompts are task questions, rendered and encoded by the `PromptRenderer` given (the
  same one the trainer uses; default: plain text with the tokenizer's special tokens), or
  token ids the caller already rendered (`Prompt = str | list[int]`);
  completions are what the model sampled, up to and including the first
  stop token (EOS), or `max_new_tokens` tokens. `Completion.text` is the decoded
  completion without special tokens; `len(token_ids) == len(logprobs)`.
- `logprobs[t]` is the log-probability of the sampled token under the temperature-scaled
  distribution `log_softmax(logits / temperature)` (before top-p truncation, so the
  trainer can recompute the same quantity); for greedy decoding (`temperature == 0`) it
  is `log_softmax(logits)`.
- `TransformersSampler` draws from its own `torch.Generator` (never the global RNG):
  `generate(..., seed=s)` is reproducible for a seed; without a seed it continues the
  sampler's own stream (seeded at construction).
- `TransformersSampler` prefills each prompt once and repeats its keys/values for its
  `n` completions (`max_batch_size` bounds the completions decoded together). The
  prefix every prompt of a batch shares (the system prompt and solved examples a node
  renders; `policy.packing.common_prefix`) is prefilled once and its keys/values
  repeated for every prompt: each token still sees exactly its own prompt at the
  positions it has alone.
- Grouped-query attention on CPU reads the key/value heads in place
  (`policy.hf_selfcheck.cpu_attention_without_kv_copies`).
- Forwards run in `compute_context` (autocast to the compute dtype over float32 master
  weights, as the trainer's forwards do).
- vLLM is imported only inside `make_sampler` for the `vllm` backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from policy.hf_selfcheck import cpu_attention_without_kv_copies
from policy.packing import common_prefix
from policy.precision import DTYPES, compute_context
from policy.prompts import PromptRenderer, plain_ids
from swarm.config.learning import ModelConfig, SamplerConfig


@dataclass(frozen=True)
class Completion:
    """One sampled completion."""

    text: str
    token_ids: list[int]
    logprobs: list[float]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; `temperature == 0` is greedy."""

    max_new_tokens: int = 8
    temperature: float = 1.0
    top_p: float = 1.0

    @classmethod
    def from_config(cls, config: SamplerConfig) -> SamplingParams:
        return cls(config.max_new_tokens, config.temperature, config.top_p)


Prompt = str | list[int]
"""A task question (rendered by the sampler's `PromptRenderer`) or rendered token ids."""


class Sampler(Protocol):
    """Generates completions and takes the trainer's new weights."""

    def generate(
        self, prompts: Sequence[Prompt], n: int, params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]: ...

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...


def encode_prompt(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a prompt in plain mode (`PromptRenderer` renders the other modes)."""
    return plain_ids(tokenizer, prompt)


def encode_completion(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a completion's text (no special tokens added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prompt_ids(renderer: PromptRenderer, prompt: Prompt) -> list[int]:
    """Token ids of a `Prompt`: rendered ids as given, a question rendered."""
    return list(prompt) if isinstance(prompt, list) else renderer.ids(prompt)


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """EOS ids of the tokenizer and the model's generation config."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


def pad_token_id(tokenizer: Any, stops: set[int]) -> int:
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    return min(stops) if stops else 0


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B], their logprobs [B]) from last-position logits [B, V] (float32)."""
    if params.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        tokens = logits.argmax(dim=-1)
        return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p  # keeps at least one
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class TransformersSampler:
    """Batched sampling with a `transformers` causal LM and a KV cache (CPU or GPU).

    It may share its model with the trainer: then `update_weights` has nothing to copy.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: torch.device | str | None = None,
        seed: int = 0,
        max_batch_size: int = 256,
        renderer: PromptRenderer | None = None,
        compute_dtype: torch.dtype | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.renderer = renderer if renderer is not None else PromptRenderer(tokenizer)
        cpu_attention_without_kv_copies()
        self.device = torch.device(device) if device is not None else model.device
        self.param_dtype = next(model.parameters()).dtype
        self.compute_dtype = compute_dtype if compute_dtype is not None else self.param_dtype
        self.max_batch_size = max_batch_size
        self.stops = stop_token_ids(model, tokenizer)
        self.pad_id = pad_token_id(tokenizer, self.stops)
        self._gen_device = "cuda" if self.device.type == "cuda" else "cpu"
        self._generator = torch.Generator(device=self._gen_device).manual_seed(seed)

    def generate(
        self, prompts: Sequence[Prompt], n: int, params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        """`n` completions for each prompt, grouped per prompt in prompt order."""
        if n < 1:
            raise ValueError("n must be >= 1")
        generator = self._generator
        if seed is not None:
            generator = torch.Generator(device=self._gen_device).manual_seed(seed)
        unique = [prompt_ids(self.renderer, p) for p in prompts]
        per_batch = max(1, self.max_batch_size // n)
        flat: list[Completion] = []
        for start in range(0, len(unique), per_batch):
            flat.extend(
                self._generate_rows(unique[start : start + per_batch], n, params, generator)
            )
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    @torch.no_grad()
    def _generate_rows(
        self,
        prompts: list[list[int]],
        n: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> list[Completion]:
        """`n` completions of each prompt (prompt-major). Each prompt is prefilled once;
        its keys/values, last logits and masks are then repeated for its `n` rows. The
        prompts' common prefix is prefilled once, then each prompt's rest, left-padded
        after it: `[prefix | pad .. | rest]`, positions continuing the prefix."""
        if max(len(r) for r in prompts) == 0:
            raise ValueError("empty prompt: the tokenizer added no tokens and the text is empty")
        shared = common_prefix(prompts)
        rests = [row[shared:] for row in prompts]
        width = max(len(r) for r in rests)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, row in enumerate(rests):  # left padding
            if row:
                ids[i, width - len(row) :] = torch.tensor(row)
                mask[i, width - len(row) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = shared + (mask.cumsum(-1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        numerics = compute_context(self.device, self.compute_dtype, self.param_dtype)
        try:
            with numerics:
                past = None
                if shared:
                    prefix = torch.tensor([prompts[0][:shared]], device=self.device)
                    past = self.model(
                        input_ids=prefix, use_cache=True, logits_to_keep=1
                    ).past_key_values
                    past.batch_repeat_interleave(len(prompts))
                    mask = torch.cat([torch.ones_like(mask[:, :1]).expand(-1, shared), mask], 1)
                out = self.model(  # logits of the last position only: [B, 1, V], not [B, T, V]
                    input_ids=ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=past,
                    use_cache=True,
                    logits_to_keep=1,
                )
                past, logits = out.past_key_values, out.logits[:, -1].float()
                if n > 1:
                    past.batch_repeat_interleave(n)
                    logits = logits.repeat_interleave(n, dim=0)
                    mask = mask.repeat_interleave(n, dim=0)
                    positions = positions.repeat_interleave(n, dim=0)
                next_pos = positions[:, -1:] + 1
                rows = len(prompts) * n
                tokens_out: list[torch.Tensor] = []
                logps_out: list[torch.Tensor] = []
                done = torch.zeros(rows, dtype=torch.bool, device=self.device)
                stops = torch.tensor(sorted(self.stops), dtype=torch.long, device=self.device)
                for step in range(params.max_new_tokens):
                    tokens, logps = sample_next(logits, params, generator)
                    tokens = tokens.to(self.device).masked_fill(done, self.pad_id)
                    tokens_out.append(tokens)
                    logps_out.append(logps.to(self.device))
                    done = done | torch.isin(tokens, stops)
                    if bool(done.all()) or step == params.max_new_tokens - 1:
                        break
                    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
                    out = self.model(
                        input_ids=tokens[:, None],
                        attention_mask=mask,
                        position_ids=next_pos,
                        past_key_values=past,
                        use_cache=True,
                    )
                    past, logits = out.past_key_values, out.logits[:, -1].float()
                    next_pos = next_pos + 1
        finally:
            self.model.train(was_training)
        all_tokens = torch.stack(tokens_out, 1).tolist()
        all_logps = torch.stack(logps_out, 1).tolist()
        return [self._completion(t, lp) for t, lp in zip(all_tokens, all_logps, strict=True)]

    def _completion(self, tokens: list[int], logps: list[float]) -> Completion:
        keep = len(tokens)
        for i, tok in enumerate(tokens):
            if tok in self.stops:
                keep = i + 1
                break
        ids, lps = tokens[:keep], logps[:keep]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Completion(text=text, token_ids=ids, logprobs=lps)

    @torch.no_grad()
    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy new weights in place (skipped for tensors this model already shares)."""
        own = self.model.state_dict()
        missing = set(own) - set(state_dict)
        if missing:
            raise KeyError(f"update_weights: missing tensors {sorted(missing)[:5]}")
        for name, src in state_dict.items():
            dst = own.get(name)
            if dst is None:
                raise KeyError(f"update_weights: unknown tensor {name!r}")
            if dst.data_ptr() != src.data_ptr():
                dst.copy_(src)


def make_sampler(
    sampler_config: SamplerConfig,
    model: Any,
    tokenizer: Any,
    model_config: ModelConfig,
    renderer: PromptRenderer | None = None,
    on_ranks: bool = False,
) -> Sampler:
    """The configured backend. `transformers` shares `model` (no weight copies);
    `vllm` builds its own engine from the same weights (imported only here). `on_ranks`:
    this process is one of a node's training ranks that each sample (a vLLM engine then
    forms over their process group, built by every rank at once)."""
    renderer = renderer if renderer is not None else PromptRenderer(tokenizer)
    if sampler_config.backend == "transformers":
        return TransformersSampler(
            model,
            tokenizer,
            seed=model_config.chosen_seed(),
            renderer=renderer,
            compute_dtype=DTYPES[model_config.dtype],
        )
    if sampler_config.backend == "vllm":
        from policy.vllm_sampler import VllmSampler

        return VllmSampler(
            model,
            tokenizer,
            model_config,
            gpu_memory_utilization=sampler_config.vllm_gpu_memory_utilization,
            max_model_len=sampler_config.vllm_max_model_len,
            enforce_eager=sampler_config.vllm_enforce_eager,
            renderer=renderer,
            tensor_parallel_size=sampler_config.vllm_tensor_parallel_size,
            over_ranks=on_ranks,
        )
    raise ValueError(f"unknown sampler backend {sampler_config.backend!r}")
