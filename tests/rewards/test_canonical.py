"""`canonical_completion`: the part of a completion the reward reads, with the same score."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rewards.registry import canonical_completion, score
from rewards.tasks import make_task
from swarm.config.tasks import RewardsConfig
from swarm.messages import TaskRef

SOURCES = ("add", "copy", "reverse", "compare", "digit")
PIECES = ["<answer>", "</answer>", "\n", " ", "\t", "x", "ab", "-", ".", "1,000"]
CORRECTNESS = ("exact", "numeric", "closeness", "source")
CONFIGS = [RewardsConfig(correctness=c, format_weight=0.0) for c in CORRECTNESS] + [
    # answer_format matters only with a format reward (a config refuses it otherwise)
    RewardsConfig(correctness=c, answer_format=f, format_weight=0.5)
    for c in CORRECTNESS
    for f in ("first_line", "answer_block")
]


@pytest.mark.parametrize(
    ("completion", "canonical"),
    [
        ("7", "7"),
        ("7 ", "7"),  # signal_bait: the answer and a trailing space
        (" 7\nrubbish", "7"),  # the reward reads the first line only
        ("\n7", ""),  # an empty first line: no answer, as before
        (
            "think <answer>12</answer> more <answer>13</answer> tail",
            "think <answer>12</answer> more <answer>13</answer>",
        ),
        ("<answer>unclosed\nline", "<answer>unclosed"),
        ("", ""),
    ],
)
def test_canonical_forms(completion: str, canonical: str) -> None:
    assert canonical_completion(completion) == canonical


@settings(max_examples=400, deadline=None)
@given(
    source=st.sampled_from(SOURCES),
    index=st.integers(0, 50),
    parts=st.lists(st.one_of(st.sampled_from(PIECES), st.integers(0, 30).map(str)), max_size=8),
    answer_at=st.integers(-1, 8),
)
def test_the_canonical_form_scores_exactly_as_the_completion(
    source: str, index: int, parts: list[str], answer_at: int
) -> None:
    task = make_task(TaskRef(source, 7, index))
    if 0 <= answer_at <= len(parts):
        parts = [*parts[:answer_at], task.answer, *parts[answer_at:]]
    completion = "".join(parts)
    canonical = canonical_completion(completion)
    assert canonical_completion(canonical) == canonical  # idempotent
    for config in CONFIGS:
        assert score(task, canonical, config) == score(task, completion, config), (
            completion,
            canonical,
            config,
        )
