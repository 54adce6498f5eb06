"""A step's rows without a model: skipping, group indices, local ids, peers' treatment."""

from __future__ import annotations

import pytest
import torch

from policy.prompts import PromptRenderer
from policy.tiny import char_tokenizer
from policy.train_rows import RowBuilder
from policy.train_types import StepStats, TrainGroup
from swarm.config.learning import TrainConfig


def _builder(group_size: int | None = 2, **cfg: object) -> RowBuilder:
    tok = char_tokenizer()
    config = TrainConfig(**cfg)  # type: ignore[arg-type]
    return RowBuilder(config, group_size, PromptRenderer(tok), tok, tok.eos_token_id, 4)


def test_degenerate_and_empty_groups_are_skipped_and_rows_know_their_group() -> None:
    builder = _builder()
    tok = builder.tokenizer
    ids = [tok("7")["input_ids"], tok("3")["input_ids"]]
    groups = [
        TrainGroup("3+4=", ["7", "7"], [1.0, 1.0], ids),  # one reward: no signal
        TrainGroup("3+4=", ["7", "3"], [1.0, 0.0], ids, prompt_ids=[5, 6]),
        TrainGroup("1+1=", ["2", "2x"], [1.0, 0.0], local=False),  # nothing ended
    ]
    rows = builder.rows_of(groups, stats := StepStats())
    assert stats.n_groups == 1 and stats.n_skipped == 2 and stats.n_peer_partial == 2
    assert [(r.ids, r.start, r.group, r.peer) for r in rows] == [
        ([5, 6, *ids[0]], 2, 1, False),
        ([5, 6, *ids[1]], 2, 1, False),
    ]
    assert rows[0].advantage > 0 > rows[1].advantage


def test_long_completions_are_left_out() -> None:
    builder = _builder(max_completion_tokens=2)
    tok = builder.tokenizer
    group = TrainGroup(
        "3+4=", ["7", "777"], [1.0, 0.0], [tok(t)["input_ids"] for t in "7 777".split()]
    )
    rows = builder.rows(group, stats := StepStats())
    assert len(rows) == 1 and stats.n_too_long == 1


@pytest.mark.parametrize(
    ("cfg", "n_lp", "expected"),
    [
        ({"peer_offpolicy": "tis"}, 2, ("n_peer_tis", True, False)),
        ({"peer_offpolicy": "tis"}, 1, ("n_peer_mismatch", False, False)),
        ({"foreign_rule": "plausible"}, 2, (None, False, True)),
        ({}, 2, ("n_peer_ratio_one", False, False)),
    ],
)
def test_peer_treatment(cfg: dict, n_lp: int, expected: tuple) -> None:
    counter, has_lp, check = expected
    builder = _builder(**cfg)
    # "7" then our EOS (positive advantage, trained with the stop token): 2 tokens
    group = TrainGroup(
        "3+4=",
        ["7", "3"],
        [1.0, 0.0],
        sampler_logprobs=[[-0.5] * n_lp, [-0.5] * n_lp],
        local=False,
        finished=[True, True],
    )
    row = builder.rows(group, stats := StepStats())[0]
    assert row.peer and row.ids[row.start :] == [
        *builder.tokenizer("7")["input_ids"],
        builder.eos_id,
    ]
    assert (row.sampler_logprobs is not None) == has_lp and row.check_plausible == check
    if counter is not None:
        assert getattr(stats, counter) == 2  # both rows


def test_oversized_group_is_weighted_to_the_local_size() -> None:
    group = TrainGroup("3+4=", ["7", "3"] * 2, [1.0, 0.0] * 2, local=False, finished=[True] * 4)
    weighted = [r.advantage for r in _builder(group_size=2).rows(group)]
    unweighted = [r.advantage for r in _builder(group_size=None).rows(group)]
    assert weighted == pytest.approx([a / 2 for a in unweighted])


def test_batch_scale_shares_one_std_across_the_step_s_groups() -> None:
    tok = char_tokenizer()
    ids = [tok(t)["input_ids"] for t in ("7", "3", "1", "2")]
    groups = [
        TrainGroup("3+4=", ["7", "3", "1", "2"], [1.0, 0.0, 0.0, 0.0], ids),
        TrainGroup("1+1=", ["7", "3", "1", "2"], [1.0, 1.0, 0.0, 0.0], ids),
    ]
    per_group = _builder(4).rows_of(groups, StepStats())
    per_batch = _builder(4, scale_rewards="batch").rows_of(groups, StepStats())
    # The first row's advantage: 0.75 over the group's std (0.5) or the batch's (over 8).
    spread = float(torch.tensor([1.0, 0, 0, 0, 1, 1, 0, 0]).std())
    assert per_group[0].advantage == pytest.approx(0.75 / (0.5 + 1e-4), rel=1e-5)
    assert per_batch[0].advantage == pytest.approx(0.75 / (spread + 1e-4), rel=1e-5)
    assert per_batch[4].advantage == pytest.approx(0.5 / (spread + 1e-4), rel=1e-5)


def _peer_group(sent: list[list[int] | None], texts: tuple[str, str] = ("73", "3")) -> TrainGroup:
    return TrainGroup("3+4=", list(texts), [1.0, 0.0], local=False, finished=[True, True],
                      sampler_logprobs=[[-0.5] * 3, [-0.5] * 2], peer_token_ids=sent)  # fmt: skip


def test_a_peer_s_sampled_ids_are_trained_where_they_decode_to_the_text() -> None:
    builder = _builder(group_size=2, peer_tokens="as_sampled", peer_offpolicy="tis")
    tok, eos = builder.tokenizer, builder.eos_id
    sent = [tok("73")["input_ids"], tok("3")["input_ids"]]
    rows = builder.rows(_peer_group(sent), stats := StepStats())
    # As sampled, with our EOS after the ended completion of positive advantage; the ids
    # line up with the peer's logprobs (stop token included), so they weigh the tokens.
    assert rows[0].ids[rows[0].start :] == [*sent[0], eos]
    assert stats.n_peer_as_sampled == 2 and stats.n_peer_ids_refused == 0
    assert stats.n_peer_tis == 2 and stats.n_peer_mismatch == 0


@pytest.mark.parametrize(
    "sent",
    [
        [[5, 6], None],  # ids of another text than "73"
        [[10**6, 3], None],  # an id outside our vocabulary
    ],
)
def test_sent_ids_that_are_not_the_text_are_refused_and_the_text_re_tokenized(sent: list) -> None:
    builder = _builder(group_size=2, peer_tokens="as_sampled")
    tok, eos = builder.tokenizer, builder.eos_id
    rows = builder.rows(_peer_group(sent), stats := StepStats())
    assert rows[0].ids[rows[0].start :] == [*tok("73")["input_ids"], eos]
    assert stats.n_peer_ids_refused == 1 and stats.n_peer_as_sampled == 0


def test_retokenized_ignores_sent_ids() -> None:
    builder = _builder(group_size=2)  # peer_tokens = "retokenized", the default
    tok = builder.tokenizer
    rows = builder.rows(_peer_group([[5, 6], [7]]), stats := StepStats())
    assert rows[0].ids[rows[0].start :] == [*tok("73")["input_ids"], builder.eos_id]
    assert stats.n_peer_ids_refused == 0 and stats.n_peer_as_sampled == 0


def test_positive_peer_advantages_leave_out_the_peers_answers_below_their_group_mean() -> None:
    texts, rewards = ["7", "77", "3", "33"], [1.0, 0.5, 0.0, 0.0]  # mean 0.375
    everything = _builder(group_size=4)
    positive = _builder(group_size=4, peer_advantages="positive")
    tok = everything.tokenizer

    def peer() -> TrainGroup:
        return TrainGroup("3+4=", texts, rewards, local=False, finished=[True] * 4)

    all_rows = everything.rows(peer(), StepStats())
    kept = positive.rows(peer(), stats := StepStats())
    assert [r.advantage for r in all_rows][2:] == [pytest.approx(all_rows[2].advantage)] * 2
    assert all_rows[2].advantage < 0
    # The two answers above the mean, with the advantages the whole group gives them.
    assert [(r.ids, r.advantage) for r in kept] == [(r.ids, r.advantage) for r in all_rows[:2]]
    assert stats.n_peer_negative == 2
    # Our own group keeps its wrong answers: the rule is for peers' groups only.
    ids = [tok(t)["input_ids"] for t in texts]
    own = positive.rows(TrainGroup("3+4=", texts, rewards, ids), own_stats := StepStats())
    assert len(own) == 4 and own_stats.n_peer_negative == 0
