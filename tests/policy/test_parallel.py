"""Training across ranks (issue 36): a step split over 2 gloo processes under DDP and FSDP
equals the one-process step: the loss, every parameter's gradient, the counters, the
parameters after one optimizer step and the optimizer state a checkpoint gathers (by
parameter index, as a one-process checkpoint holds it), on the batch of
`packed_exactness` (ragged local completions with sampler logprobs, a peer's oversized
group with partial and too-long completions, another prompt), full fine-tuning and LoRA,
micro-batches of 2 rows (so the ranks get unequal numbers of them and FSDP runs empty
passes). Rank 1 builds other initial weights than rank 0 (as a node's ranks may), which
rank 0's replace. With a KL term (`beta > 0`), the policy's weights are loaded after the
trainer is built, so that the reference (a sharded or broadcast copy, or the LoRA base)
differs from the policy and its gradient counts.

Tolerance: float32, each gradient's difference relative to its norm <= 2e-5 (the
one-process packed step against the plain one is held to the same), the loss to 1e-5
relative, and the weights after the step to 1% of the learning rate; what differs is only
the order of summation.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from policy.parallel import RankInfo, assign_micro_batches
from tests.policy import packed_exactness, parallel_ranks

FP32 = 2e-5
PARAM_TOLERANCE = 1e-2 * parallel_ranks.TRAIN["learning_rate"]
"""Weights after one AdamW step, where the gradient is at least `STEADY_EPS` x eps."""
STEADY_EPS = 100
"""In units of AdamW's eps (read from the optimizer). Its first update is
lr * g / (|g| + eps): where |g| is near eps a round-off difference in g moves the update
by a share of lr (measured: elements with |g| ~ 5e-9, whose gradients differ by 27%
between the paths while the tensor's differ by 1e-7 of its norm, moved by up to 3.7e-5 =
3.7% of lr, a different amount every run: gloo's and FSDP's summation order varies).
Above 100x eps the update's sensitivity is below 1e-2 of the gradient's relative
difference."""
NEAR_EPS_SHARE = 1e-4
"""The share of all elements allowed outside `PARAM_TOLERANCE` (those near eps; measured:
1-2 of 65,536 in a few tensors)."""
COUNTERS = (
    "n_groups",
    "n_skipped",
    "n_sequences",
    "n_tokens",
    "n_too_long",
    "n_peer_partial",
    "n_peer_plausible",
    "n_peer_implausible",
    "tokens_computed",
    "policy_version",
)


def test_micro_batches_are_each_computed_once_and_balanced() -> None:
    costs = [9, 1, 5, 5, 3, 8, 2]
    owner = assign_micro_batches(costs, 2)
    loads = [sum(c for c, o in zip(costs, owner, strict=True) if o == r) for r in (0, 1)]
    assert sorted(loads) == [16, 17]
    assert assign_micro_batches(costs, 2) == owner  # every rank computes the same
    assert assign_micro_batches(costs, 1) == [0] * len(costs)
    assert sorted(assign_micro_batches([4, 4, 4], 8)) == [0, 1, 2]  # idle ranks allowed
    with pytest.raises(ValueError):
        assign_micro_batches(costs, 0)


def test_rank_info_is_checked() -> None:
    with pytest.raises(ValueError):
        RankInfo("ddp", 2, 2)
    with pytest.raises(ValueError):
        RankInfo("none", 0, 2)


def _one_process(case: dict[str, Any]) -> dict[str, Any]:
    net, tok = parallel_ranks.model(case["lora"])
    t = parallel_ranks.trainer(net, tok, None, **case["train"])
    if case.get("resumed"):
        net.load_state_dict(parallel_ranks.trained_weights(net), strict=False)
    groups = packed_exactness.batch(tok, parallel_ranks.PROMPTS)
    stats, grads = t.loss_and_gradients(groups)
    step = t.step(groups)
    return {
        "stats": stats.as_dict(),
        "grads": grads,
        "step": step.as_dict(),
        "params": {k: v.detach().clone() for k, v in t.model.state_dict().items()},
        "optimizer": t.optimizer.state_dict(),
    }


CASES = {
    "ddp-full": ("ddp", {"lora": False, "train": {}}),
    "fsdp-full": ("fsdp", {"lora": False, "train": {}}),
    "ddp-lora-plausible": ("ddp", {"lora": True, "train": {"foreign_rule": "plausible"}}),
    "fsdp-lora-2-iterations": ("fsdp", {"lora": True, "train": {"num_iterations": 2}}),
    # The KL reference unlike the policy (weights loaded after the trainer was built):
    # under FSDP a sharded copy, or the LoRA base through the policy's engine; under DDP
    # rank 0's copy on every rank.
    "fsdp-full-kl": ("fsdp", {"lora": False, "resumed": True, "train": {"beta": 0.5}}),
    "fsdp-lora-kl": ("fsdp", {"lora": True, "resumed": True, "train": {"beta": 0.5}}),
    "ddp-full-kl": ("ddp", {"lora": False, "resumed": True, "train": {"beta": 0.5}}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_equal_one_process(name: str, tmp_path: Path) -> None:
    kind, case = CASES[name]
    if case["train"].get("foreign_rule") == "plausible":
        net, tok = parallel_ranks.model(case["lora"])
        groups = packed_exactness.batch(tok, parallel_ranks.PROMPTS)
        case["train"]["min_mean_logprob"] = packed_exactness.implausible_threshold(net, tok, groups)
    out = tmp_path / "rank0.pt"
    mp.start_processes(
        parallel_ranks.run_rank,
        args=(2, kind, str(tmp_path / "store"), str(out), case),
        nprocs=2,
        start_method="spawn",
    )
    got = torch.load(out, weights_only=False)
    want = _one_process(case)
    for name_ in COUNTERS:
        assert got["stats"][name_] == want["stats"][name_], name_
        assert got["step"][name_] == want["step"][name_], name_
    assert want["stats"]["n_sequences"] > 0
    if case["train"].get("foreign_rule") == "plausible":
        assert want["stats"]["n_peer_implausible"] >= 1
    assert abs(got["stats"]["loss"] - want["stats"]["loss"]) <= 1e-5 * abs(want["stats"]["loss"])
    if case["train"].get("beta"):
        assert want["stats"]["kl"] > 1e-3  # the reference is not the policy
        assert abs(got["stats"]["kl"] - want["stats"]["kl"]) <= 1e-5 * want["stats"]["kl"]
    assert set(got["grads"]) == set(want["grads"]) and want["grads"]
    assert packed_exactness.relative_gap(got["grads"], want["grads"]) <= FP32
    assert set(got["params"]) == set(want["params"])
    moved = 0.0
    outside = total = 0
    steady_grad = STEADY_EPS * want["optimizer"]["param_groups"][0]["eps"]
    for key, before_after in want["params"].items():
        gap = (got["params"][key] - before_after).abs()
        grad = want["grads"].get(key)  # None: a frozen weight, held to the tolerance too
        steady = gap >= 0 if grad is None else grad.abs() >= steady_grad
        worst = float(gap[steady].max()) if bool(steady.any()) else 0.0
        assert worst <= PARAM_TOLERANCE, (key, worst)
        outside += int((gap > PARAM_TOLERANCE).sum())
        total += gap.numel()
    assert outside <= NEAR_EPS_SHARE * total, (outside, total)
    # The optimizer state a checkpoint gathers is the one-process optimizer's, by index.
    got_opt, want_opt = got["optimizer"], want["optimizer"]
    assert set(got_opt["state"]) == set(want_opt["state"]) and want_opt["state"]
    for index, slots in want_opt["state"].items():
        for slot, value in slots.items():
            other = got_opt["state"][index][slot]
            # Relative to the tensor's norm, as the gradients (`exp_avg_sq` holds g squared:
            # twice g's relative gap). Element-wise, a near-zero moment differs by more
            # (measured: 3e-3 relative on a 2e-9 gap, the tensor's norm 4e-7 apart).
            gap = float((other.float() - value.float()).norm())
            assert gap <= 2 * FP32 * float(value.float().norm()), (index, slot, gap)
    assert [g["params"] for g in got_opt["param_groups"]] == [
        g["params"] for g in want_opt["param_groups"]
    ]
    # The step moved the weights (the comparison above is not of two untouched models).
    net, _ = parallel_ranks.model(case["lora"])
    if case.get("resumed"):
        net.load_state_dict(parallel_ranks.trained_weights(net), strict=False)
    for key, value in net.state_dict().items():
        moved = max(moved, float((want["params"][key] - value).abs().max()))
    assert moved > 5e-4  # Adam's first step moves a weight by up to the learning rate
