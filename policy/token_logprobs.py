"""Per-token logprobs (and entropies) of completions under a causal LM, two ways.

- `packed` (the fast path): a group's prompt is computed once and its completions
  against it (`policy.packing`: positions and a 4D attention mask make each completion
  see exactly `prompt + itself`); the LM head and log-softmax run only at the positions
  that predict a completion token (the decoder's hidden states are gathered there
  first), never at prompt positions or padding.
- `reference`: the plain computation, one right-padded row per `prompt + completion`,
  logits and log-softmax at every position, then the completion positions gathered.

Invariants:
- Both return the same quantities: `log_softmax(logits / temperature)` of each
  completion token, [B, T] with a [B, T] mask (row i's first `len(completion_i)` entries),
  and optionally the policy's entropy at those positions; the packed path equals the
  reference to float round-off (tests compare loss and every gradient on the built-in
  and a real model).
- The packed path is used only where it was verified on this model at construction
  (`verify`: a shared-prefix batch against the reference, in the parameters' dtype);
  a model whose attention ignores custom 4D masks (e.g. flash attention), whose head
  cannot be found or does something more after it fails the check and gets the
  reference path, saying why in `fallback_reason`. The attention implementation is the
  config's private `_attn_implementation` (`policy.hf_selfcheck.attention_implementation`:
  a transformers without it turns the packed path off with one WARNING naming its version).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from policy.hf_selfcheck import attention_implementation, cpu_attention_without_kv_copies
from policy.packing import PackedBatch, additive_mask, pack
from policy.precision import compute_context

CUSTOM_MASK_ATTENTION = ("sdpa", "eager")
"""Attention implementations that apply a given 4D mask as it is."""
_CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
_CHECK_TOLERANCE_LOW_PRECISION = 5e-2

Sequences = Sequence[tuple[Sequence[int], Sequence[int]]]
"""(prompt ids, completion ids) per sequence."""


def _unwrap(model: Any) -> Any:
    """The transformers model inside a PEFT wrapper (LoRA layers are injected in place)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def model_parts(model: Any) -> tuple[Any, Any, Callable[[torch.Tensor], torch.Tensor]]:
    """(decoder, LM head, what the model does to the head's output) of a causal LM.

    Raises ValueError where the model does not expose them."""
    inner = _unwrap(model)
    get_decoder = getattr(inner, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if decoder is None or head is None or decoder is inner:
        raise ValueError(f"{type(inner).__name__} exposes no separate decoder and LM head")
    cap = getattr(inner.config, "final_logit_softcapping", None)
    if cap:
        return decoder, head, lambda logits: torch.tanh(logits / cap) * cap
    return decoder, head, lambda logits: logits


class TokenLogprobs:
    """Computes completion logprobs for one model structure (the policy and its frozen
    reference copy share it). `packed=False` forces the reference path."""

    def __init__(
        self,
        model: Any,
        device: torch.device,
        compute_dtype: torch.dtype,
        param_dtype: torch.dtype,
        temperature: float,
        pad_id: int,
        packed: bool = True,
    ) -> None:
        self.device = device
        self.compute_dtype = compute_dtype
        self.param_dtype = param_dtype
        self.temperature = temperature
        self.pad_id = pad_id
        self.fallback_reason: str | None = None
        cpu_attention_without_kv_copies()  # before the check, which then covers it
        self.packed = packed and self._verify(model)
        self.last_padding_share = 0.0
        """Share of padding among the positions the last call computed."""
        self.last_tokens_computed = 0
        """Positions the last call ran through the model."""

    def __call__(
        self, model: Any, sequences: Sequences, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logprobs [B, T], mask [B, T], entropies [B, T] or None) of each completion."""
        if self.packed:
            return self.packed_logprobs(model, sequences, entropy)
        return self.reference_logprobs(model, sequences, entropy)

    def _context(self, exact: bool = False) -> Any:
        compute = self.param_dtype if exact else self.compute_dtype
        return compute_context(self.device, compute, self.param_dtype)

    def packed_logprobs(
        self, model: Any, sequences: Sequences, entropy: bool = False, exact: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        batch = pack(sequences, self.pad_id)
        decoder, head, after_head = model_parts(model)
        attention = attention_implementation(_unwrap(model).config)
        mask = batch.allowed if attention == "sdpa" else additive_mask(batch.allowed, torch.float32)
        dev = self.device
        with self._context(exact):
            hidden = decoder(
                input_ids=batch.input_ids.to(dev),
                attention_mask=mask.to(dev),
                position_ids=batch.position_ids.to(dev),
                use_cache=False,
            ).last_hidden_state
            logits = head(hidden[batch.target_row.to(dev), batch.target_col.to(dev)])
        logp = torch.log_softmax(after_head(_at_least_fp32(logits)) / self.temperature, dim=-1)
        self.last_padding_share = batch.padding_share
        self.last_tokens_computed = batch.n_computed_tokens
        return _scatter(batch, logp, entropy, dev)

    def reference_logprobs(
        self, model: Any, sequences: Sequences, entropy: bool = False, exact: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        seqs = [(list(p), list(c)) for p, c in sequences]
        width = max(len(p) + len(c) for p, c in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        attn = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, (p, c) in enumerate(seqs):  # right padding
            ids[i, : len(p) + len(c)] = torch.tensor(p + c)
            attn[i, : len(p) + len(c)] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        with self._context(exact):
            out = model(input_ids=ids, attention_mask=attn, use_cache=False)
        logits = _at_least_fp32(out.logits[:, :-1])
        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        token_logp = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # [B, W-1]
        comp_len = [len(c) for _, c in seqs]
        t = max(comp_len)
        index = torch.tensor(
            [[min(len(p) - 1 + j, width - 2) for j in range(t)] for p, _ in seqs],
            device=self.device,
        )
        mask = torch.tensor([[j < n for j in range(t)] for n in comp_len], device=self.device)
        entropies = None
        if entropy:
            entropies = -(logp.exp() * logp).sum(-1).gather(1, index) * mask
        self.last_padding_share = 1.0 - int(attn.sum()) / attn.numel()
        self.last_tokens_computed = attn.numel()
        return token_logp.gather(1, index) * mask, mask, entropies

    @torch.no_grad()
    def _verify(self, model: Any) -> bool:
        """Whether the packed path reproduces the reference on this model (see the
        module docstring); sets `fallback_reason` where it does not."""
        attention = attention_implementation(_unwrap(model).config)
        if attention not in CUSTOM_MASK_ATTENTION:
            self.fallback_reason = f"attention {attention!r} may not apply a custom 4D mask"
            return False
        try:
            model_parts(model)
        except ValueError as exc:
            self.fallback_reason = str(exc)
            return False
        vocab = int(_unwrap(model).get_output_embeddings().weight.shape[0])
        prompt = [(7 * i + 3) % vocab for i in range(6)]
        sequences = [
            (prompt, [(11 * i + 5) % vocab for i in range(4)]),
            (prompt, [(13 * i + 1) % vocab for i in range(2)]),
            (prompt[:3], [(17 * i + 2) % vocab for i in range(3)]),
        ]
        was_training = model.training
        model.eval()
        try:
            fast, mask, _ = self.packed_logprobs(model, sequences, exact=True)
            slow, _, _ = self.reference_logprobs(model, sequences, exact=True)
        except (RuntimeError, TypeError, ValueError) as exc:
            self.fallback_reason = f"packed forward failed: {type(exc).__name__}: {exc}"
            return False
        finally:
            model.train(was_training)
        tolerance = _CHECK_TOLERANCE.get(self.param_dtype, _CHECK_TOLERANCE_LOW_PRECISION)
        gap = float((fast - slow).abs()[mask].max())
        if not gap <= tolerance:
            self.fallback_reason = f"packed logprobs differ from the plain forward by {gap:.3g}"
            return False
        return True


def _at_least_fp32(logits: torch.Tensor) -> torch.Tensor:
    """Logits in float32, or float64 where the model computes in it (exactness tests)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _scatter(
    batch: PackedBatch, logp: torch.Tensor, entropy: bool, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Per-target log-softmax rows [N, V] into per-sequence [B, T] outputs."""
    seq, pos = batch.target_seq.to(device), batch.target_pos.to(device)
    shape = (batch.n_sequences, batch.max_completion)
    token_logp = logp.gather(-1, batch.target_ids.to(device)[:, None]).squeeze(-1)
    values = torch.zeros(shape, dtype=token_logp.dtype, device=device)
    values = values.index_put((seq, pos), token_logp)
    mask = torch.zeros(shape, dtype=torch.bool, device=device)
    mask[seq, pos] = True
    entropies = None
    if entropy:
        per_target = -(logp.exp() * logp).sum(-1)
        entropies = torch.zeros(shape, dtype=per_target.dtype, device=device)
        entropies = entropies.index_put((seq, pos), per_target)
    return values, mask, entropies
