"""The fast training path against the plain one: one batch, two trainers on identical
copies of a model, the loss and every parameter's gradient compared.

The batch has what makes packing hard: a local group with ragged completions (so rows
need padding on the plain path) and sampler logprobs (importance weights); a peer's group
of another size than the local G (weighted G / G'), with completions that did not end
(left out by `foreign_trajectory`: one of them past the local budget), a local one too
long for `max_completion_tokens` (left out)
and, with `foreign_rule = "plausible"`, at least one the local policy finds implausible
(left out of the loss after the forward); and a group whose prompt has another length.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from policy.sampler import encode_completion
from policy.trainer import StepStats, Trainer, TrainGroup
from swarm.config.learning import SamplerConfig, TrainConfig

LOCAL_TEXTS = ["7", "34", "1234567", "12"]
PEER_TEXTS = ["7", "34", "99", "8", "1234567890123", "5", "61"]
PEER_FINISHED = [True, True, False, True, True, True, False]
OTHER_TEXTS = ["4", "40", "404"]


def batch(tokenizer: Any, prompts: tuple[str, str]) -> list[TrainGroup]:
    """The three groups described in the module docstring."""
    eos = tokenizer.eos_token_id
    local_ids = [[*encode_completion(tokenizer, t), eos] for t in LOCAL_TEXTS]
    local = TrainGroup(
        prompts[0],
        LOCAL_TEXTS,
        [1.0, 0.0, 0.5, 0.0],
        completion_token_ids=local_ids,
        sampler_logprobs=[[-0.5 - 0.1 * j for j in range(len(ids))] for ids in local_ids],
    )
    peer = TrainGroup(
        prompts[0],
        PEER_TEXTS,
        [1.0, 0.0, 1.0, 0.5, 1.0, 0.0, 0.0],
        local=False,
        finished=PEER_FINISHED,
    )
    other_ids = [[*encode_completion(tokenizer, t), eos] for t in OTHER_TEXTS]
    other = TrainGroup(prompts[1], OTHER_TEXTS, [0.0, 1.0, 0.25], completion_token_ids=other_ids)
    return [local, peer, other]


def run(
    model: Any,
    tokenizer: Any,
    groups: list[TrainGroup],
    packed: bool,
    compute_dtype: torch.dtype | None = None,
    **train: Any,
) -> tuple[StepStats, dict[str, torch.Tensor], Trainer]:
    trainer = Trainer(
        copy.deepcopy(model),
        tokenizer,
        TrainConfig(foreign_stop="all", max_completion_tokens=7, **train),
        "cpu",
        sampler_config=SamplerConfig(max_new_tokens=12, group_size=4),
        compute_dtype=compute_dtype,
        packed=packed,
    )
    stats, grads = trainer.loss_and_gradients(groups)
    return stats, grads, trainer


def relative_gap(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """The largest difference of a gradient tensor, relative to its norm."""
    return max(
        float((grads[name] - g).norm()) / max(float(g.norm()), 1e-30)
        for name, g in reference.items()
    )


def compare(
    model: Any,
    tokenizer: Any,
    groups: list[TrainGroup],
    tolerance: float | None,
    compute_dtype: torch.dtype | None = None,
    **train: Any,
) -> tuple[StepStats, StepStats]:
    """Asserts both paths give the same loss and gradients (each tensor's difference,
    relative to its norm, within `tolerance`); returns (fast, plain) stats.

    `tolerance=None` measures it: 3x the gap between two plain-path computations that
    differ only in summation order (micro-batches of 1 row against the default), the
    round-off of that precision (bf16 autocast: ~0.1)."""
    fast, fast_grads, trainer = run(model, tokenizer, groups, True, compute_dtype, **train)
    assert trainer.token_logprobs.packed, trainer.token_logprobs.fallback_reason
    plain, plain_grads, _ = run(model, tokenizer, groups, False, compute_dtype, **train)
    if tolerance is None:
        one, one_grads, _ = run(
            model, tokenizer, groups, False, compute_dtype, **{**train, "micro_batch_size": 1}
        )
        tolerance = 3 * max(
            relative_gap(one_grads, plain_grads),
            abs(one.loss - plain.loss) / abs(plain.loss),
            abs(one.importance_weight_mean - plain.importance_weight_mean),
        )
    assert plain.n_sequences > 0 and fast_grads
    for name in ("n_sequences", "n_tokens", "n_too_long", "n_peer_partial", "n_groups"):
        assert getattr(fast, name) == getattr(plain, name), name
    assert (fast.n_peer_implausible, fast.n_peer_plausible) == (
        plain.n_peer_implausible,
        plain.n_peer_plausible,
    )
    assert abs(fast.loss - plain.loss) <= tolerance * max(abs(plain.loss), 1e-3)
    weight_gap = abs(fast.importance_weight_mean - plain.importance_weight_mean)
    assert weight_gap <= tolerance * plain.importance_weight_mean
    assert set(fast_grads) == set(plain_grads)
    assert relative_gap(fast_grads, plain_grads) <= tolerance
    assert fast.tokens_computed < plain.tokens_computed
    return fast, plain


def implausible_threshold(model: Any, tokenizer: Any, groups: list[TrainGroup]) -> float:
    """A `min_mean_logprob` that leaves out at least one but not every trainable peer
    completion (the median of their mean logprobs under the model, plain path)."""
    trainer = Trainer(
        copy.deepcopy(model),
        tokenizer,
        TrainConfig(foreign_stop="all", max_completion_tokens=7),
        "cpu",
        sampler_config=SamplerConfig(max_new_tokens=12, group_size=4),
        packed=False,
    )
    rows = trainer._rows(groups[1])
    with torch.no_grad():
        lp, mask, _ = trainer._logprobs(trainer.model, rows)
    means = sorted(((lp * mask).sum(1) / mask.sum(1)).tolist())
    assert len(means) >= 3
    return (means[len(means) // 2 - 1] + means[len(means) // 2]) / 2
