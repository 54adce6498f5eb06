"""The transformers sampler: shapes, stops, determinism, logprobs, weight updates."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from policy.sampler import Completion, SamplingParams, TransformersSampler, make_sampler
from policy.tiny import build_tiny
from swarm.config.learning import ModelConfig, SamplerConfig

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["3+4=", "copy abc=", "7?2="]


@pytest.fixture(scope="module")
def tiny() -> tuple:
    return build_tiny("builtin:tiny", seed=0)


def _forward_logprobs(model, tok, prompt: str, ids: list[int], temperature: float) -> torch.Tensor:
    p = tok(prompt)["input_ids"]
    full = torch.tensor([p + ids])
    with torch.no_grad():
        logits = model(full).logits[0, len(p) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, -1)
    return logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


def test_shapes_stops_and_logprobs_match_a_full_forward(tiny: tuple) -> None:
    model, tok = tiny
    sampler = TransformersSampler(model, tok, seed=0)
    params = SamplingParams(max_new_tokens=8, temperature=0.7)
    groups = sampler.generate(PROMPTS * 3, 4, params, seed=11)
    assert len(groups) == 9 and all(len(g) == 4 for g in groups)
    n_stopped = 0
    for prompt, group in zip(PROMPTS * 3, groups, strict=True):
        for c in group:
            assert len(c.token_ids) == len(c.logprobs) >= 1
            assert len(c.token_ids) <= 8
            if tok.eos_token_id in c.token_ids:
                assert c.token_ids.index(tok.eos_token_id) == len(c.token_ids) - 1
                n_stopped += 1
            else:
                assert len(c.token_ids) == 8
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
            expected = _forward_logprobs(model, tok, prompt, c.token_ids, 0.7)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)
    assert n_stopped > 0  # some rows stopped early, others ran to the limit (mixed batch)


def test_seeded_generation_is_reproducible(tiny: tuple) -> None:
    model, tok = tiny
    sampler = TransformersSampler(model, tok, seed=0)
    params = SamplingParams(max_new_tokens=5)
    a = sampler.generate(PROMPTS, 4, params, seed=1)
    assert a == sampler.generate(PROMPTS, 4, params, seed=1)
    assert a != sampler.generate(PROMPTS, 4, params, seed=2)
    # unseeded calls continue the sampler's own stream: reproducible from construction
    s1, s2 = TransformersSampler(model, tok, seed=5), TransformersSampler(model, tok, seed=5)
    assert s1.generate(PROMPTS, 2, params) == s2.generate(PROMPTS, 2, params)
    state = torch.random.get_rng_state()
    sampler.generate(PROMPTS, 2, params)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is untouched


def test_greedy_and_tiny_top_p_pick_the_argmax(tiny: tuple) -> None:
    model, tok = tiny
    sampler = TransformersSampler(model, tok)
    greedy = sampler.generate(PROMPTS, 1, SamplingParams(max_new_tokens=6, temperature=0))
    nucleus = sampler.generate(PROMPTS, 1, SamplingParams(max_new_tokens=6, top_p=1e-6), seed=3)
    for prompt, g, n in zip(PROMPTS, greedy, nucleus, strict=True):
        ids = tok(prompt)["input_ids"]
        for tok_id in g[0].token_ids:
            with torch.no_grad():
                nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            assert tok_id == nxt
            ids.append(tok_id)
        assert n[0].token_ids == g[0].token_ids
        expected = _forward_logprobs(model, tok, prompt, g[0].token_ids, 1.0)
        assert torch.allclose(torch.tensor(g[0].logprobs), expected, atol=1e-4)


def test_batched_equals_one_by_one(tiny: tuple) -> None:
    model, tok = tiny
    sampler = TransformersSampler(model, tok, max_batch_size=2)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    batched = sampler.generate(PROMPTS, 2, params)
    single = [sampler.generate([p], 2, params)[0] for p in PROMPTS]
    assert [[c.token_ids for c in g] for g in batched] == [[c.token_ids for c in g] for g in single]


def test_update_weights_changes_outputs_as_the_new_weights_say(tiny: tuple) -> None:
    model, tok = tiny
    other, _ = build_tiny("builtin:tiny", seed=1)
    mine = copy.deepcopy(model)
    sampler = TransformersSampler(mine, tok)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    before = sampler.generate(PROMPTS, 1, params)
    sampler.update_weights(other.state_dict())
    after = sampler.generate(PROMPTS, 1, params)
    reference = TransformersSampler(other, tok).generate(PROMPTS, 1, params)
    assert after == reference and after != before
    with pytest.raises(KeyError):
        sampler.update_weights({"nope": torch.zeros(1)})


def test_make_sampler_shares_the_model() -> None:
    model, tok = build_tiny("builtin:tiny")
    sampler = make_sampler(SamplerConfig(), model, tok, ModelConfig(seed=0))
    assert isinstance(sampler, TransformersSampler) and sampler.model is model
    sampler.update_weights(model.state_dict())  # shared tensors: nothing to copy


def test_vllm_is_not_imported_by_the_policy_and_rewards_packages() -> None:
    import subprocess
    import sys

    code = (
        "import sys, policy.sampler, policy.trainer, policy.loading, policy.checkpoint, "
        "policy.advantages, policy.losses, policy.tiny, rewards.registry, rewards.mixture; "
        "assert 'vllm' not in sys.modules, 'vllm imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _generate_recording_forwards(
    model: Any, tok: Any, prompts: list[str]
) -> tuple[list[list[Completion]], list[tuple[int, ...]]]:
    """4 sampled completions per prompt, and the input shape of every model forward."""
    sampler = TransformersSampler(model, tok, seed=3)
    shapes: list[tuple[int, ...]] = []
    hook = model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        groups = sampler.generate(prompts, 4, SamplingParams(max_new_tokens=5, temperature=1.0))
    finally:
        hook.remove()
    return groups, shapes


def test_each_prompt_is_prefilled_once_for_all_its_completions(tiny: tuple) -> None:
    model, tok = tiny
    groups, shapes = _generate_recording_forwards(model, tok, PROMPTS)
    width = max(len(tok(p)["input_ids"]) for p in PROMPTS)
    assert shapes[0] == (len(PROMPTS), width)  # the prefill: one row per prompt
    assert all(s == (len(PROMPTS) * 4, 1) for s in shapes[1:])  # then one token per row
    # The repeated keys/values give each completion its own prompt's distribution.
    for prompt, group in zip(PROMPTS, groups, strict=True):
        for c in group:
            expected = _forward_logprobs(model, tok, prompt, c.token_ids, 1.0)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)


def test_a_prefix_all_prompts_share_is_prefilled_once(tiny: tuple) -> None:
    model, tok = tiny
    shared = "Solve: 1+1=2. "
    prompts = [shared + p for p in PROMPTS]
    groups, shapes = _generate_recording_forwards(model, tok, prompts)
    sampler = TransformersSampler(model, tok, seed=3)
    prefix = len(tok(shared)["input_ids"])
    rest = max(len(tok(p)["input_ids"]) for p in prompts) - prefix
    assert shapes[:2] == [(1, prefix), (len(prompts), rest)]  # the prefix once, then the rests
    # Each completion still has its own whole prompt's distribution.
    for prompt, group in zip(prompts, groups, strict=True):
        for c in group:
            expected = _forward_logprobs(model, tok, prompt, c.token_ids, 1.0)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)
    greedy = SamplingParams(max_new_tokens=6, temperature=0)
    batched = sampler.generate(prompts, 2, greedy)
    single = [sampler.generate([p], 2, greedy)[0] for p in prompts]
    assert [[c.token_ids for c in g] for g in batched] == [[c.token_ids for c in g] for g in single]
