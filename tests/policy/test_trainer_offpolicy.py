"""Peers' completions in a training step: truncated importance weights against a
same-family peer's logprobs (and the count-mismatch fallback), ratio one, and the
plausibility rule. The weights the loss receives are checked against logprobs computed
here independently of the trainer."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from policy.advantages import group_advantages
from policy.losses import loss_normalizer
from policy.tiny import build_tiny
from policy.trainer import Trainer, TrainGroup
from swarm.config.learning import SamplerConfig, TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = "3+4="
TEXTS = ["7", "34", "7"]
FINISHED = [True, True, True]  # peers' unfinished completions are not trained


def _trainer(**cfg: Any) -> tuple[Trainer, list[dict[str, Any]]]:
    """A trainer whose loss function records the keyword arguments of each call."""
    model, tok = build_tiny("builtin:tiny", seed=0)
    cfg.setdefault("foreign_stop", "all")  # every ended completion with its stop token
    config = TrainConfig(learning_rate=1e-3, **cfg)
    trainer = Trainer(model, tok, config, "cpu", sampler_config=SamplerConfig(max_new_tokens=4))
    calls: list[dict[str, Any]] = []
    real = trainer.loss_fn

    def spy(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        calls.append({"advantages": args[2], **kwargs, "loss": float(out.loss.detach())})
        return out

    trainer.loss_fn = spy
    return trainer, calls


def _local_ids(trainer: Trainer, text: str, finished: bool) -> list[int]:
    ids = trainer.tokenizer(text)["input_ids"]
    return [*ids, trainer.tokenizer.eos_token_id] if finished else ids


def _token_logprobs(trainer: Trainer, text: str, finished: bool) -> list[float]:
    """Per-token logprobs of a completion under the trainer's model, computed here."""
    prompt = trainer.renderer.ids(PROMPT)
    ids = _local_ids(trainer, text, finished)
    with torch.no_grad():
        logits = trainer.model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1)
    return logp.gather(-1, torch.tensor(ids)[:, None]).squeeze(-1).tolist()


def _peer_claims(old: list[list[float]]) -> list[list[float]]:
    """Peer logprobs offset from ours: weights e^-0.5, e^0.3, e^2 (capped), ..."""
    offsets = [0.5, -0.3, -2.0]
    return [
        [min(o + offsets[(i + j) % 3], 0.0) for j, o in enumerate(row)] for i, row in enumerate(old)
    ]


def _peer_group(
    claims: list[list[float]] | None,
    rewards: list[float] | None = None,
    texts: list[str] = TEXTS,
) -> TrainGroup:
    return TrainGroup(
        PROMPT,
        list(texts),
        rewards or [1.0, 0.0, 1.0],
        sampler_logprobs=claims,
        local=False,
        finished=list(FINISHED),
    )


def test_a_same_family_peers_group_gets_exactly_the_truncated_weights() -> None:
    trainer, calls = _trainer(peer_offpolicy="tis", importance_cap=2.0)
    old = [_token_logprobs(trainer, t, f) for t, f in zip(TEXTS, FINISHED, strict=True)]
    claims = _peer_claims(old)
    stats = trainer.step([_peer_group(claims)])
    (call,) = calls
    weights = call["importance_weights"]
    expected_all = []
    for i, (ours, theirs) in enumerate(zip(old, claims, strict=True)):
        expected = [min(math.exp(a - b), 2.0) for a, b in zip(ours, theirs, strict=True)]
        expected_all += expected
        n = len(expected)
        assert weights[i, :n].tolist() == pytest.approx(expected, abs=1e-5)
        assert torch.all(weights[i, n:] == 1.0)
    assert 2.0 in expected_all and min(expected_all) < 1.0  # the cap binds; some weigh less
    assert (stats.n_peer_tis, stats.n_peer_mismatch, stats.n_peer_ratio_one) == (3, 0, 0)
    assert stats.peer_weight_mean == pytest.approx(sum(expected_all) / len(expected_all), 1e-5)
    assert stats.importance_weight_mean == 1.0  # no local tokens with logprobs
    assert stats.policy_version == 1


def test_a_count_mismatch_falls_back_to_the_foreign_rule() -> None:
    trainer, calls = _trainer(peer_offpolicy="tis")
    old = [_token_logprobs(trainer, t, f) for t, f in zip(TEXTS, FINISHED, strict=True)]
    claims = _peer_claims(old)
    claims[1] = claims[1] + [-1.0]  # one logprob too many for "34"
    stats = trainer.step([_peer_group(claims)])
    weights = calls[0]["importance_weights"]
    assert torch.all(weights[1] == 1.0)  # ratio one
    assert not torch.all(weights[0] == 1.0) and not torch.all(weights[2] == 1.0)
    assert (stats.n_peer_tis, stats.n_peer_mismatch, stats.n_peer_ratio_one) == (2, 1, 1)


def test_ratio_one_ignores_a_peers_logprobs() -> None:
    trainer, calls = _trainer()  # the default: peer_offpolicy = "ratio_one"
    old = [_token_logprobs(trainer, t, f) for t, f in zip(TEXTS, FINISHED, strict=True)]
    stats = trainer.step([_peer_group(_peer_claims(old))])
    assert calls[0]["importance_weights"] is None
    assert (stats.n_peer_tis, stats.n_peer_ratio_one, stats.peer_weight_mean) == (0, 3, 1.0)


def test_no_claim_makes_a_peers_token_weigh_more_than_the_cap() -> None:
    trainer, calls = _trainer(peer_offpolicy="tis", importance_cap=1.5)
    old = [_token_logprobs(trainer, t, f) for t, f in zip(TEXTS, FINISHED, strict=True)]
    claims = [[-3.0e38] * len(row) for row in old]  # "I almost never sample this"
    stats = trainer.step([_peer_group(claims)])
    weights = calls[0]["importance_weights"]
    assert float(weights.max()) == 1.5
    assert stats.n_peer_tis == 3 and stats.peer_weight_mean == 1.5


DISTINCT = ["7", "34", "12"]


def _means(trainer: Trainer) -> list[float]:
    rows = [_token_logprobs(trainer, t, f) for t, f in zip(DISTINCT, FINISHED, strict=True)]
    return [sum(r) / len(r) for r in rows]


def test_the_plausible_rule_leaves_out_what_the_local_policy_finds_unlikely() -> None:
    probe, _ = _trainer()
    means = _means(probe)
    worst = min(range(3), key=means.__getitem__)
    rest = sorted(m for i, m in enumerate(means) if i != worst)
    assert means[worst] < rest[0]  # one completion is the least likely
    threshold = (means[worst] + rest[0]) / 2
    rewards = [1.0, 1.0, 1.0]
    rewards[worst] = 0.0  # without it the group would have no reward variance
    trainer, calls = _trainer(foreign_rule="plausible", min_mean_logprob=threshold)
    stats = trainer.step([_peer_group(None, rewards, DISTINCT)])
    (call,) = calls
    weights = call["importance_weights"]
    assert torch.all(weights[worst] == 0.0)
    assert all(torch.all(weights[i] == 1.0) for i in range(3) if i != worst)
    assert (stats.n_peer_plausible, stats.n_peer_implausible, stats.n_peer_ratio_one) == (2, 1, 0)
    # It still counts in the group's advantages (its reward is real) ...
    adv = group_advantages(torch.tensor(rewards), "mean", "group")
    assert call["advantages"].tolist() == pytest.approx(adv.tolist())
    # ... but not in the step's normalizers (the loss is a sum, divided once at the end).
    kept = [i for i in range(3) if i != worst]
    kept_tokens = sum(len(_local_ids(trainer, DISTINCT[i], FINISHED[i])) for i in kept)
    assert (call["num_sequences"], call["num_tokens"]) == (1, 1)
    normalizer = loss_normalizer(trainer.config.loss_type, 2, kept_tokens, 4)
    assert stats.loss == pytest.approx(call["loss"] / normalizer)
    assert (stats.n_sequences, stats.n_tokens, stats.policy_version) == (2, kept_tokens, 1)


def test_nothing_plausible_takes_no_step() -> None:
    trainer, _ = _trainer(foreign_rule="plausible", min_mean_logprob=0.0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    stats = trainer.step([_peer_group(None)])
    assert stats.policy_version == 0 and stats.n_sequences == 0
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in trainer.model.parameters())
    assert (stats.n_peer_implausible, stats.n_peer_plausible) == (3, 0)


def test_local_groups_are_never_judged_for_plausibility() -> None:
    trainer, calls = _trainer(foreign_rule="plausible", min_mean_logprob=0.0)
    ids = [_local_ids(trainer, t, f) for t, f in zip(TEXTS, FINISHED, strict=True)]
    stats = trainer.step([TrainGroup(PROMPT, list(TEXTS), [1.0, 0.0, 1.0], ids)])
    assert calls[0]["importance_weights"] is None
    assert stats.policy_version == 1 and stats.n_peer_implausible == 0


def test_tis_with_the_plausible_rule_judges_only_the_fallbacks() -> None:
    trainer, calls = _trainer(peer_offpolicy="tis", foreign_rule="plausible", min_mean_logprob=0.0)
    old = [_token_logprobs(trainer, t, f) for t, f in zip(TEXTS, FINISHED, strict=True)]
    claims = _peer_claims(old)
    claims[0] = claims[0][:-1]  # a mismatch: falls back to the plausible rule, left out
    stats = trainer.step([_peer_group(claims)])
    weights = calls[0]["importance_weights"]
    assert torch.all(weights[0] == 0.0)
    assert (stats.n_peer_tis, stats.n_peer_mismatch, stats.n_peer_implausible) == (2, 1, 1)


def test_a_stop_token_left_untrained_drops_its_claimed_logprob() -> None:
    """`foreign_stop = "positive"`: the wrong "34" is trained without its stop token, so
    the peer's logprob for that token is dropped and the rest still line up (TIS)."""
    trainer, calls = _trainer(peer_offpolicy="tis", foreign_stop="positive")
    old = [_token_logprobs(trainer, t, f) for t, f in zip(TEXTS, FINISHED, strict=True)]
    stats = trainer.step([_peer_group(old)])  # claims equal to ours: weights 1
    assert (stats.n_peer_tis, stats.n_peer_mismatch) == (3, 0)
    assert (stats.n_sequences, stats.n_tokens) == (3, 6)  # "7"+EOS, "34" without EOS, "7"+EOS
    assert calls[0]["importance_weights"].max() == pytest.approx(1.0, abs=1e-5)
