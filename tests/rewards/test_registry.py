"""Rewards: extraction, correctness by name, format reward, time limits."""

from __future__ import annotations

import os
from typing import Any

import pytest

from rewards import registry
from rewards.registry import (
    best_constant,
    build_tasks,
    extract_answer,
    format_reward,
    live_reward_threads,
    register_correctness,
    resolve_answer_format,
    reward_counters,
    score,
    score_group,
    set_time_limit_mode,
)
from rewards.tasks import Task, make_task
from swarm.config.tasks import RewardsConfig
from swarm.messages import TaskRef
from tests.rewards import slow_source


def correctness_only(**fields: Any) -> RewardsConfig:
    """A rewards config without the format reward (the default adds 0.5 for the form)."""
    return RewardsConfig(**{"format_weight": 0.0, **fields})


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("7", "7"),
        (" 7 \nrubbish", "7"),
        ("", None),
        ("\n7", None),
        ("think... <answer> 12 </answer> more <answer>13</answer>", "13"),
        ("<answer>\n5\n</answer>", "5"),
        ("<answer>unclosed", "<answer>unclosed"),
        ("<answer> </answer>", ""),  # an empty block is an answer
    ],
)
def test_extract_answer(completion: str, answer: str | None) -> None:
    assert extract_answer(completion) == answer


def _add_task() -> Task:
    task = make_task(TaskRef("add", 0, 0))
    assert task.prompt == "4+7=" and task.answer == "11"
    return task


def test_exact_and_source_correctness_on_builtin() -> None:
    task = _add_task()
    for name in ("exact", "source"):
        cfg = correctness_only(correctness=name)
        assert score(task, "11", cfg) == 1.0
        assert score(task, "11\n3+3=6", cfg) == 1.0
        assert score(task, "1", cfg) == 0.0
        assert score(task, "111", cfg) == 0.0
        assert score(task, "", cfg) == 0.0
    assert score_group(task, ["11", "2", "11"], correctness_only()) == [1.0, 0.0, 1.0]


def test_numeric_correctness() -> None:
    task = _add_task()
    cfg = correctness_only(correctness="numeric")
    assert score(task, "11.0", cfg) == 1.0
    assert score(task, "eleven", cfg) == 0.0


def test_format_reward_is_added_with_its_weight() -> None:
    task = _add_task()
    cfg = RewardsConfig(format_weight=0.5)
    assert format_reward(task, "3") == 1.0
    assert format_reward(task, "3a") == 0.0
    assert score(task, "11", cfg) == 1.5
    assert score(task, "12", cfg) == 0.5
    assert score(task, "x", cfg) == 0.0
    assert format_reward(task, "<answer>11</answer>") == 0.0  # first_line wants it bare


def test_format_reward_needs_a_well_formed_answer_block() -> None:
    task = _add_task()
    assert format_reward(task, "so <answer> 3 </answer>", "answer_block") == 1.0
    assert format_reward(task, "<answer>3a</answer>", "answer_block") == 0.0
    assert format_reward(task, "3", "answer_block") == 0.0
    assert format_reward(task, "<answer>3", "answer_block") == 0.0
    cfg = RewardsConfig(format_weight=0.5, answer_format="answer_block")
    assert score(task, "<answer>11</answer>", cfg) == 1.5
    assert score(task, "11", cfg) == 1.0  # correct either way; formatted only in a block
    rg = make_task(TaskRef("rg:basic_arithmetic", 0, 1))
    for fmt in ("first_line", "answer_block"):  # rg questions ask for the block
        assert format_reward(rg, "any text at all", fmt) == 0.0
        assert format_reward(rg, "<answer></answer>", fmt) == 1.0


def test_resolve_answer_format_follows_the_prompt_mode() -> None:
    cfg = RewardsConfig()
    assert resolve_answer_format(cfg, chat=True).answer_format == "answer_block"
    assert resolve_answer_format(cfg, chat=False).answer_format == "first_line"
    fixed = RewardsConfig(answer_format="first_line")
    assert resolve_answer_format(fixed, chat=True).answer_format == "first_line"


def test_reasoning_gym_scored_by_its_own_scorer_through_the_registry() -> None:
    task = make_task(TaskRef("rg:basic_arithmetic", 0, 1))
    cfg = correctness_only()
    assert score(task, f"work...\n<answer>{task.answer}</answer>", cfg) == 1.0
    assert score(task, "<answer>definitely wrong</answer>", cfg) == 0.0
    exact = correctness_only(correctness="exact")
    assert score(task, f"<answer>{task.answer}</answer>", exact) == 1.0


def test_unknown_correctness_name() -> None:
    with pytest.raises(KeyError, match="exact"):
        score(_add_task(), "11", correctness_only(correctness="nope"))


def _register(name: str, fn: Any, slow: bool) -> None:
    if name not in registry.CORRECTNESS:
        register_correctness(name, fn, slow=slow, doc=name)


def test_slow_reward_is_killed_at_its_limit_scores_zero_and_is_counted() -> None:
    """Process mode (the default): the reward runs in the sandbox, killed at the limit."""
    _register("test-hang", slow_source.hang_reward, True)
    _register("test-where", slow_source.where, True)
    where = correctness_only(correctness="test-where")
    # runs in the sandbox: an empty directory that is not ours
    assert score(_add_task(), os.getcwd(), where) == 1.0
    before = reward_counters()["timeouts"]
    sandbox = registry._get_sandbox()
    timeouts, starts = sandbox.counts["timeouts"], sandbox.counts["starts"]
    assert score(_add_task(), "11", correctness_only(correctness="test-hang", timeout_s=0.2)) == 0.0
    assert reward_counters()["timeouts"] == before + 1
    assert sandbox.counts["timeouts"] == timeouts + 1  # its worker was killed
    assert live_reward_threads() == 0  # and no thread of ours is left running it
    assert score(_add_task(), os.getcwd(), where) == 1.0  # the next one: a fresh worker
    assert sandbox.counts["starts"] == starts + 1


def test_thread_mode_counts_the_abandoned_thread_until_it_ends() -> None:
    """Thread mode (inside worker processes): the thread is abandoned and counted."""
    _register("test-hang", slow_source.hang_reward, True)
    before = reward_counters()["timeouts"]
    set_time_limit_mode("thread")
    try:
        value = score(_add_task(), "11", correctness_only(correctness="test-hang", timeout_s=0.05))
        assert value == 0.0
        assert reward_counters()["timeouts"] == before + 1
        assert live_reward_threads() == 1
    finally:
        set_time_limit_mode("process")
        slow_source.RELEASE.set()
    for thread in list(registry._abandoned):
        thread.join()
    slow_source.RELEASE.clear()
    assert live_reward_threads() == 0


def test_a_slow_reward_must_be_a_module_level_function() -> None:
    with pytest.raises(ValueError, match="module-level"):
        register_correctness("test-closure", lambda s, t, a: 1.0, slow=True, doc="closure")
    assert "test-closure" not in registry.CORRECTNESS


def test_raising_reward_scores_zero_and_is_counted() -> None:
    for name, slow in (("test-boom-slow", True), ("test-boom-fast", False)):
        _register(name, slow_source.raising_reward, slow)
        before = reward_counters()["errors"]
        assert score(_add_task(), "11", correctness_only(correctness=name)) == 0.0
        assert reward_counters()["errors"] == before + 1


def test_non_finite_reward_scores_zero() -> None:
    name = "test-nan"
    if name not in registry.CORRECTNESS:
        register_correctness(name, lambda s, t, a: float("nan"), slow=False, doc="nan")
    assert score(_add_task(), "11", correctness_only(correctness=name)) == 0.0


def test_duplicate_registration_refused() -> None:
    with pytest.raises(ValueError):
        register_correctness("exact", lambda s, t, a: 1.0, slow=False, doc="dup")


def test_extract_answer_matches_the_regex_and_stays_linear_on_hostile_text() -> None:
    import random
    import re
    import time

    pattern = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
    rng = random.Random(0)
    parts = ["<answer>", "</answer>", "7", " ", "\n", "<", "/"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randrange(30)))
        found = pattern.findall(text)
        expected = found[-1].strip() if found else text.split("\n", 1)[0].strip() or None
        assert extract_answer(text) == expected, text
    start = time.process_time()
    extract_answer("<answer>" * 8192)  # 64 KB: quadratic for the regex (seconds)
    assert time.process_time() - start < 0.2


def test_an_empty_answer_block_can_be_the_right_answer() -> None:
    task = make_task(TaskRef("rg:ab", 0, 38))  # one of reasoning-gym ab's empty answers
    assert task.answer == ""
    assert score(task, "<answer></answer>", correctness_only()) == 1.0
    assert score(task, "<answer>A#</answer>", correctness_only()) == 0.0


def test_a_slow_item_build_is_not_timed_as_its_scoring() -> None:
    """The scorer's limit times the scorer: a group's item is built in the scoring worker
    first, under the group's limit. Scoring alone, the scorer's first call there rebuilds
    the item and the build (0.8 s) runs into the 0.4 s limit: a correct answer scores 0."""
    config = correctness_only(correctness="source", timeout_s=0.4)
    source = slow_source.SlowBuildSource()
    task = source.make(7, 1)  # built here; the worker has its own cache
    before = reward_counters()["timeouts"]
    assert score_group(task, ["8", "8", "9"], config) == [1.0, 1.0, 0.0]
    assert reward_counters()["timeouts"] == before
    cold = source.make(7, 2)
    assert score(cold, "9", config) == 0.0  # what scoring alone did to a correct answer
    assert reward_counters()["timeouts"] == before + 1


def test_own_tasks_that_do_not_build_in_time_are_left_out_and_counted() -> None:
    """A slow source's item is built in the scoring worker under `rescore_timeout_s`: one
    that never builds costs the limit and is left out, one whose generator raises is left
    out, the rest come back built and in order (their items then cached for scoring)."""
    import time

    config = correctness_only(timeout_s=0.2, rescore_timeout_s=2.0)
    refs = [TaskRef(slow_source.HANG_BUILD, 3, i) for i in (2, 1, 10, 4)]
    start = time.monotonic()
    tasks, skipped = build_tasks(refs, config)
    assert time.monotonic() - start < 10  # one limit (2 s) and a fresh worker, not forever
    assert [t.ref.index for t in tasks] == [2, 4]
    assert [t.answer for t in tasks] == ["2", "4"]
    assert skipped == {"task_build_timeout": 1, "task_build_error": 1}
    assert score_group(tasks[1], ["4", "5"], config) == [1.0, 0.0]


def test_fast_sources_build_here_and_an_unknown_one_is_left_out() -> None:
    refs = [TaskRef("add", 0, 0), TaskRef("no-such-source", 0, 0), TaskRef("add", 0, 1)]
    tasks, skipped = build_tasks(refs, correctness_only())
    assert [t.ref for t in tasks] == [refs[0], refs[2]]
    assert tasks[0] == make_task(refs[0])
    assert skipped == {"task_build_error": 1}


def test_the_best_constant_answer_under_exact_match_is_the_most_common_gold() -> None:
    tasks = [make_task(TaskRef("digit", 0, i)) for i in range(40)]
    golds = [t.answer for t in tasks]
    answer, mean = best_constant(tasks, correctness_only(correctness="exact")) or ("", 0.0)
    top = max(set(golds), key=golds.count)
    assert mean == golds.count(top) / 40 and golds.count(answer) == golds.count(top)
    assert best_constant([], correctness_only()) is None


def test_under_partial_credit_a_constant_scores_above_any_gold_share() -> None:
    """spell_backward credits letters in place: one reversed word, given to all 32 tasks
    (no two share an answer), scores far above 1/32 (computed in the scoring worker, the
    same as scoring each pair here)."""
    tasks = [make_task(TaskRef("rg:spell_backward", 11, i)) for i in range(32)]
    assert len({t.answer for t in tasks}) == 32
    config = correctness_only()
    answer, mean = best_constant(tasks, config) or ("", 0.0)
    assert mean > 2 / 32
    here = [score(t, f"<answer>{answer}</answer>", config) for t in tasks]
    assert abs(mean - sum(here) / 32) < 1e-9
    others = [
        sum(score(t, f"<answer>{u.answer}</answer>", config) for t in tasks) / 32 for u in tasks
    ]
    assert abs(max(others) - mean) < 1e-9


def test_a_constant_that_cannot_be_scored_in_time_is_unknown() -> None:
    _register("test-hang", slow_source.hang_reward, True)
    tasks = [make_task(TaskRef("add", 0, i)) for i in range(2)]
    assert best_constant(tasks, correctness_only(correctness="test-hang", timeout_s=0.1)) is None
