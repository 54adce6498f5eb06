"""`policy.trajectories`: which ids of a peer's completion are trained."""

from __future__ import annotations

import pytest

from policy.trajectories import peer_completion_ids

EOS = 1


@pytest.mark.parametrize(
    ("ids", "finished", "budget", "ended", "whole"),
    [
        ([5], True, 3, [5, EOS], [5, EOS]),  # ended, fits with its EOS
        ([5, 6], True, 3, [5, 6, EOS], [5, 6, EOS]),  # exactly the budget with EOS
        ([5, 6, 7], True, 3, None, None),  # ended, but EOS would be token 4
        ([5, 6, 7], False, 3, None, [5, 6, 7]),  # unfinished, fills the budget
        ([5, 6], False, 3, None, None),  # unfinished and short: a prefix
        ([5, 6, 7, 8], False, 3, None, None),  # longer than the budget
        ([], False, 3, None, None),
        ([5, 6], False, None, None, [5, 6]),  # no budget known: `whole` takes it as it is
        ([5, 6], True, None, [5, 6, EOS], [5, 6, EOS]),
    ],
)
def test_ended_and_whole_rules(
    ids: list[int],
    finished: bool,
    budget: int | None,
    ended: list[int] | None,
    whole: list[int] | None,
) -> None:
    for rule, expected in (("ended", ended), ("whole", whole)):
        got = peer_completion_ids(ids, finished, EOS, budget, rule, append_eos=True)  # type: ignore[arg-type]
        assert got.ids == expected, rule
        assert got.outcome == ("partial" if expected is None else "whole")
        if got.ids is not None and budget is not None:
            assert len(got.ids) <= budget


def test_without_an_eos_token_nothing_ends() -> None:
    assert peer_completion_ids([5], True, None, 3, "ended", True).ids is None
    assert peer_completion_ids([5], True, None, 3, "whole", True).ids is None
    assert peer_completion_ids([5, 6, 7], True, None, 3, "whole", True).ids == [5, 6, 7]


@pytest.mark.parametrize("rule", ["ended", "whole"])
def test_an_ended_completion_without_its_stop_token_must_still_fit_with_it(rule: str) -> None:
    got = peer_completion_ids([5, 6], True, EOS, 3, rule, append_eos=False)  # type: ignore[arg-type]
    assert (got.ids, got.outcome, got.ended_without_eos) == ([5, 6], "whole", True)
    # [5, 6, 7] + EOS would not have fitted: the local sampler would not have stopped there
    assert peer_completion_ids([5, 6, 7], True, EOS, 3, rule, append_eos=False).ids is None


@pytest.mark.parametrize(
    ("ids", "finished", "append_eos", "expected", "outcome"),
    [
        ([5], True, False, [5], "as_text"),  # the earlier default: no EOS
        ([5], True, True, [5, EOS], "as_text"),
        ([5, 6], False, True, [5, 6], "as_text"),  # a prefix is trained as it is
        ([5, 6, 7], True, True, [5, 6, 7], "truncated"),  # EOS would not fit: cut
        ([5, 6, 7, 8], False, False, [5, 6, 7], "truncated"),
    ],
)
def test_text_rule(
    ids: list[int], finished: bool, append_eos: bool, expected: list[int], outcome: str
) -> None:
    got = peer_completion_ids(ids, finished, EOS, 3, "text", append_eos=append_eos)
    assert not got.ended_without_eos
    assert (got.ids, got.outcome) == (expected, outcome)


def test_the_input_list_is_never_aliased() -> None:
    ids = [5, 6, 7]
    for finished, rule in ((False, "whole"), (True, "text")):
        got = peer_completion_ids(ids, finished, EOS, 3, rule, append_eos=False)  # type: ignore[arg-type]
        assert got.ids == ids and got.ids is not ids
