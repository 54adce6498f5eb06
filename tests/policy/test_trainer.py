"""The trainer: parameter updates, skipping, foreign re-tokenization, importance weights."""

from __future__ import annotations

import copy

import pytest
import torch

from policy.sampler import SamplingParams, TransformersSampler, encode_prompt
from policy.tiny import TINY_CHARS, build_tiny, char_tokenizer
from policy.trainer import StepStats, Trainer, TrainGroup
from swarm.config.learning import SamplerConfig, TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer(seed: int = 0, **cfg: object) -> Trainer:
    model, tok = build_tiny("builtin:tiny", seed=seed)
    cfg.setdefault("learning_rate", 1e-3)
    config = TrainConfig(**cfg)  # type: ignore[arg-type]
    return Trainer(model, tok, config, "cpu", sampler_config=SamplerConfig(max_new_tokens=4))


def _logprob(trainer: Trainer, prompt: str, completion_ids: list[int]) -> float:
    p = encode_prompt(trainer.tokenizer, prompt)
    ids = torch.tensor([p + completion_ids])
    with torch.no_grad():
        logp = torch.log_softmax(trainer.model(ids).logits[0, len(p) - 1 : -1], -1)
    return float(logp.gather(-1, torch.tensor(completion_ids)[:, None]).sum())


def _local_group(trainer: Trainer, prompt: str, rewards: dict[str, float]) -> TrainGroup:
    tok = trainer.tokenizer
    texts = list(rewards)
    ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
    return TrainGroup(prompt, texts, [rewards[t] for t in texts], ids)


def test_step_moves_probability_toward_rewarded_completions() -> None:
    trainer = _trainer()
    group = _local_group(trainer, "3+4=", {"7": 1.0, "3": 0.0, "12": 0.0})
    good, bad = group.completion_token_ids[0], group.completion_token_ids[1]  # type: ignore[index]
    before = [p.detach().clone() for p in trainer.model.parameters()]
    lp_good, lp_bad = _logprob(trainer, "3+4=", good), _logprob(trainer, "3+4=", bad)
    for _ in range(5):
        stats = trainer.step([group])
    assert stats.n_groups == 1 and stats.n_skipped == 0 and stats.n_sequences == 3
    assert stats.n_tokens == 2 + 2 + 3 and stats.policy_version == 5
    assert trainer.policy_version == 5
    assert any(
        not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(), strict=True)
    )
    assert _logprob(trainer, "3+4=", good) > lp_good + 0.5
    assert _logprob(trainer, "3+4=", bad) < lp_bad
    assert stats.grad_norm > 0 and stats.reward_mean == pytest.approx(1 / 3)
    assert set(stats.as_dict()) >= {
        "loss",
        "n_groups",
        "n_tokens",
        "clip_frac",
        "kl",
        "grad_norm",
        "policy_version",
    }


def _next_token_entropy(trainer: Trainer, prompt: str) -> float:
    ids = torch.tensor([encode_prompt(trainer.tokenizer, prompt)])
    with torch.no_grad():
        logp = torch.log_softmax(trainer.model(ids).logits[0, -1], -1)
    return float(-(logp.exp() * logp).sum())


def test_entropy_bonus_keeps_the_policy_from_settling_on_one_answer() -> None:
    entropies = {}
    for coef in (0.0, 0.5):
        trainer = _trainer(entropy_coef=coef)
        group = _local_group(trainer, "3+4=", {"7": 1.0, "3": 0.0, "12": 0.0})
        for _ in range(10):
            stats = trainer.step([group])
        entropies[coef] = _next_token_entropy(trainer, "3+4=")
        assert (stats.entropy > 0) == (coef > 0)  # computed only when used
    assert entropies[0.5] > entropies[0.0] + 0.1


def test_zero_variance_groups_are_skipped_and_take_no_step() -> None:
    trainer = _trainer()
    before = copy.deepcopy(trainer.model.state_dict())
    stats = trainer.step(
        [
            _local_group(trainer, "1+1=", {"2": 1.0, "3": 1.0}),
            _local_group(trainer, "1+2=", {"2": 0.0, "4": 0.0}),
            TrainGroup("5+5=", ["10"], [1.0]),
        ]
    )
    assert isinstance(stats, StepStats)
    assert (stats.n_groups, stats.n_skipped, stats.policy_version) == (0, 3, 0)
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, before[k])
    mixed = trainer.step(
        [
            _local_group(trainer, "1+1=", {"2": 1.0, "3": 1.0}),
            _local_group(trainer, "1+2=", {"3": 1.0, "4": 0.0}),
        ]
    )
    assert (mixed.n_groups, mixed.n_skipped, mixed.policy_version) == (1, 1, 1)


def test_each_groups_mean_logprob_under_the_policy_before_the_step_is_reported() -> None:
    trainer = _trainer()
    texts = {"3": 1.0, "4": 0.0}
    group = _local_group(trainer, "1+2=", texts)
    tok = trainer.tokenizer
    expected = [  # each completion's summed logprob, over its tokens (the text, EOS)
        (_logprob(trainer, "1+2=", tok(t)["input_ids"] + [tok.eos_token_id]), 2) for t in texts
    ]
    stats = trainer.step([_local_group(trainer, "1+1=", {"2": 1.0, "3": 1.0}), group])
    assert stats.group_logprob[0] is None  # skipped: nothing of it trained
    mean = sum(total for total, _ in expected) / sum(n for _, n in expected)
    assert stats.group_logprob[1] == pytest.approx(mean, abs=1e-4)


def test_foreign_group_is_retokenized_with_the_local_tokenizer() -> None:
    trainer = _trainer()
    peer_tok = char_tokenizer(TINY_CHARS[::-1])  # same characters, different vocab order
    texts = ["7", "34", "7"]
    peer_ids = [peer_tok(t)["input_ids"] for t in texts]
    assert peer_ids[0] != trainer.tokenizer("7")["input_ids"]
    foreign = TrainGroup(
        "3+4=",
        texts,
        [1.0, 0.0, 1.0],
        completion_token_ids=peer_ids,
        sampler_logprobs=[[-9.0] * len(i) for i in peer_ids],
        local=False,
        finished=[True, True, True],
    )
    rows = trainer._rows(foreign)
    local = trainer.tokenizer
    eos = local.eos_token_id
    assert [r.ids[r.start :] for r in rows] == [
        local("7")["input_ids"] + [eos],
        local("34")["input_ids"],  # a wrong answer: trained down without its stop token
        local("7")["input_ids"] + [eos],
    ]
    assert all(r.sampler_logprobs is None for r in rows)  # no ratio against the peer
    lp_before = _logprob(trainer, "3+4=", local("7")["input_ids"] + [eos])
    stats = trainer.step([foreign])
    assert stats.n_groups == 1 and stats.importance_weight_mean == 1.0
    assert stats.clip_frac == 0.0  # ratio is exactly 1 at the first (only) iteration
    assert _logprob(trainer, "3+4=", local("7")["input_ids"] + [eos]) > lp_before


def test_local_importance_weights_follow_the_sampler() -> None:
    trainer = _trainer()
    sampler = TransformersSampler(trainer.model, trainer.tokenizer)
    comps = sampler.generate(["3+4="], 6, SamplingParams(max_new_tokens=4), seed=0)[0]
    rewards = [float(i % 2) for i in range(6)]
    same = TrainGroup(
        "3+4=",
        [c.text for c in comps],
        rewards,
        [c.token_ids for c in comps],
        [c.logprobs for c in comps],
    )
    stats = trainer.step([same])
    assert stats.importance_weight_mean == pytest.approx(1.0, abs=1e-4)  # same model, same logprobs
    # sampler logprobs lower than the trainer's by log 2 -> weights 2, capped at 1.5
    trainer2 = _trainer(importance_cap=1.5)
    shifted = TrainGroup(
        "3+4=",
        same.completions,
        rewards,
        same.completion_token_ids,
        [[lp - 0.6931 for lp in c.logprobs] for c in comps],
    )
    assert trainer2.step([shifted]).importance_weight_mean == pytest.approx(1.5, abs=1e-4)


def test_num_iterations_micro_batches_and_clipping() -> None:
    trainer = _trainer(num_iterations=4, micro_batch_size=2, epsilon=0.05, learning_rate=1e-2)
    group = _local_group(trainer, "3+4=", {"7": 1.0, "3": 0.0, "9": 0.0, "12": 0.0, "1": 0.5})
    stats = trainer.step([group])
    assert stats.policy_version == 4
    assert stats.clip_frac > 0  # later iterations move the ratio past 1 +- 0.05


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_micro_batching_gives_the_same_loss_and_gradient(loss_type: str) -> None:
    results = []
    for mb in (64, 1):
        trainer = _trainer(micro_batch_size=mb, loss_type=loss_type)
        group = _local_group(trainer, "3+4=", {"7": 1.0, "3": 0.0, "12": 0.0, "8": 0.0})
        stats = trainer.step([group])
        results.append((stats.loss, stats.grad_norm))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5, abs=1e-7)
    assert results[0][1] == pytest.approx(results[1][1], rel=1e-4)


def test_dr_grpo_without_a_sampler_config_uses_one_normalizer_per_step() -> None:
    results = []
    for mb in (64, 1):
        model, tok = build_tiny("builtin:tiny", seed=0)
        config = TrainConfig(learning_rate=1e-3, micro_batch_size=mb, loss_type="dr_grpo")
        trainer = Trainer(model, tok, config, "cpu")  # no sampler config: no budget known
        group = _local_group(trainer, "3+4=", {"7": 1.0, "3": 0.0, "12": 0.0, "8": 0.0})
        stats = trainer.step([group])
        results.append((stats.loss, stats.grad_norm))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5, abs=1e-7)
    assert results[0][1] == pytest.approx(results[1][1], rel=1e-4)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_every_loss_type_and_the_median_baseline_train(loss_type: str) -> None:
    trainer = _trainer(loss_type=loss_type, baseline="median", beta=0.1)
    group = _local_group(trainer, "3+4=", {"7": 1.0, "3": 0.0, "12": 0.0})
    stats = trainer.step([group])
    assert stats.n_sequences == 2  # the pivot (the median, reward 0 at index 1) is dropped
    stats = trainer.step([group])
    assert stats.kl > 0  # moved away from the frozen reference


def test_bad_groups_are_refused() -> None:
    with pytest.raises(ValueError):
        TrainGroup("p", ["a", "b"], [1.0])
    with pytest.raises(ValueError):
        TrainGroup("p", ["a"], [1.0], [[1, 2]], [[0.0]])


def test_state_dict_for_sampler_shares_tensors() -> None:
    model, tok = build_tiny("builtin:tiny")
    trainer = Trainer(model, tok, TrainConfig(), "cpu")
    sd = trainer.state_dict_for_sampler()
    assert all(not t.requires_grad for t in sd.values())
    assert sd["model.embed_tokens.weight"].data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_overlong_foreign_completions_are_left_out() -> None:
    model, tok = build_tiny("builtin:tiny")
    trainer = Trainer(model, tok, TrainConfig(max_completion_tokens=5), "cpu")  # no budget
    group = TrainGroup(
        "3+4=", ["7", "ab" * 50, "3"], [1.0, 1.0, 0.0], local=False, finished=[True] * 3
    )
    stats = trainer.step([group])
    assert (stats.n_too_long, stats.n_truncated, stats.n_sequences, stats.n_groups) == (
        1,
        0,
        2,
        1,
    )


@pytest.mark.parametrize("rule", ["ended", "whole"])
def test_peers_completions_are_trained_only_where_they_ended(rule: str) -> None:
    trainer = _trainer(foreign_trajectory=rule)  # local max_new_tokens = 4
    eos = trainer.tokenizer.eos_token_id
    texts = ["7", "abab", "ab" * 50, "abab", "7 "]
    group = TrainGroup(
        "3+4=",
        texts,
        [1.0, 0.0, 0.0, 0.0, 1.0],
        local=False,
        finished=[True, True, True, False, False],
    )
    rows = trainer._rows(group, stats := StepStats())
    # "7"+EOS fits; "abab"+EOS (5) and the long one do not fit; "abab" unfinished fills the
    # budget (trained by `whole` only); "7 " unfinished is a prefix (left out by both)
    expected = [trainer.tokenizer("7")["input_ids"] + [eos]]
    if rule == "whole":
        expected.append(trainer.tokenizer("abab")["input_ids"])
    assert [r.ids[r.start :] for r in rows] == expected
    assert (stats.n_peer_partial, stats.n_truncated) == (5 - len(expected), 0)
    # the left-out completions still count in the group's advantages: "7" is one of two
    # correct completions of five, not the only correct one of two
    std = float(torch.tensor([1.0, 0, 0, 0, 1]).std())
    assert rows[0].advantage == pytest.approx((1 - 0.4) / std, rel=1e-3)


def test_text_rule_cuts_foreign_completions_to_the_local_budget_without_eos() -> None:
    trainer = _trainer(foreign_trajectory="text", foreign_eos=True)  # max_new_tokens = 4
    eos = trainer.tokenizer.eos_token_id
    group = TrainGroup(
        "3+4=", ["7", "abab", "ab" * 50], [1.0, 0.0, 0.0], local=False, finished=[True] * 3
    )
    rows = trainer._rows(group, stats := StepStats())
    assert [len(r.ids) - r.start for r in rows] == [2, 4, 4]
    assert rows[0].ids[-1] == eos  # "7" + EOS fits the budget
    assert eos not in rows[1].ids[rows[1].start :]  # "abab" + EOS would be 5 tokens: cut
    assert eos not in rows[2].ids[rows[2].start :]
    assert stats.n_truncated == 2


def test_oversized_groups_weigh_as_one_local_group() -> None:
    trainer = _trainer()  # SamplerConfig() default group size 8
    small = TrainGroup(
        "3+4=", ["7", "3"] * 4, [1.0, 0.0] * 4, local=False, finished=[True] * 8
    )  # G' = 8
    big = TrainGroup(
        "3+4=", ["7", "3"] * 16, [1.0, 0.0] * 16, local=False, finished=[True] * 32
    )  # G' = 32
    adv_small = [r.advantage for r in trainer._rows(small)]
    weighted = [r.advantage for r in trainer._rows(big)]
    trainer.group_size = None
    unweighted = [r.advantage for r in trainer._rows(big)]
    assert weighted == pytest.approx([a * 8 / 32 for a in unweighted])
    # so the big group's total weight is about one local group's
    assert sum(map(abs, weighted)) == pytest.approx(sum(map(abs, adv_small)), rel=0.1)


def test_learning_rate_follows_warmup_and_schedule() -> None:
    trainer = _trainer(warmup_steps=2, lr_schedule="linear", schedule_steps=4, min_lr_ratio=0.5)
    group = _local_group(trainer, "3+4=", {"7": 1.0, "3": 0.0})
    lrs = [trainer.step([group]).learning_rate for _ in range(5)]
    assert lrs == pytest.approx([5e-4, 1e-3, 1e-3, 0.75e-3, 0.5e-3])


def test_delta_and_bias_corrected_kl_reach_the_loss() -> None:
    """The TRL options are wired into the step: after a first large update the second
    iteration's ratios move away from 1, so delta (just above 1) caps some of them and the
    bias-corrected KL weighs each token's KL by its ratio: the step's loss differs."""

    def loss(**cfg: object) -> float:
        trainer = _trainer(num_iterations=2, learning_rate=5e-2, beta=0.1, **cfg)
        group = _local_group(trainer, "3+4=", {"7": 1.0, "3": 0.0, "12": 0.0, "1": 0.0})
        return trainer.step([group]).loss

    plain = loss()
    assert loss() == plain  # the same seed and batch give the same step
    assert loss(delta=1.001) != pytest.approx(plain, rel=1e-6)
    assert loss(use_bias_correction_kl=True) != pytest.approx(plain, rel=1e-6)
