"""Held-out evaluation and the samples log: fixed, never trained on, bounded."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gossip.memory import MemoryNetwork
from node.build import apply_overrides
from node.evaluation import (
    MIXTURE,
    MODAL_ANSWER_CHARS,
    HeldOut,
    combine_results,
    eval_record,
    held_out_seed,
    modal_share,
)
from node.learner import EvalResult
from node.metrics import read_metrics
from node.samples import SamplesLog, read_samples
from rewards.mixture import TaskStream
from rewards.tasks import make_task
from swarm.config import parse_config
from swarm.errors import ConfigError
from swarm.identity import Identity
from swarm.messages import RolloutBatch, RolloutGroup
from tests.node.helpers import stub_config, stub_node
from tests.node.test_version_claims import batch, envelope_of

SEEDS = {"model": {"seed": 0}, "tasks": {"seed": 0}}
"""A held-out set needs the seeds a node would derive from its key."""


def test_held_out_set_is_fixed_and_apart_from_training() -> None:
    config = parse_config({"model": {"seed": 0}, "tasks": {"seed": 7}, "eval": {"num_tasks": 16}})
    a, b = HeldOut(config), HeldOut(config)
    assert a.refs == b.refs and len(a.refs) == 16
    training = TaskStream(config.tasks, config.model.seed).next_refs(1000)
    assert not {r.seed for r in training} & a.seeds
    assert held_out_seed(config) != config.tasks.seed
    fixed = parse_config({"eval": {"seed": 123}})
    assert held_out_seed(fixed) == 123
    assert [a.due(r) for r in range(0, 60, 25)] == [True, True, True]
    assert not a.due(1) and not HeldOut(parse_config({"eval": {"every": 0}, **SEEDS})).due(0)


def test_default_held_out_set_is_the_own_mixture_as_before() -> None:
    config = parse_config({"model": {"seed": 0}, "tasks": {"seed": 7}, "eval": {"num_tasks": 16}})
    held = HeldOut(config)
    tasks = config.tasks.model_copy(update={"seed": held_out_seed(config)})
    assert held.sets == {MIXTURE: TaskStream(tasks, config.model.seed).next_refs(16)}
    assert not held.per_source and held.refs == held.sets[MIXTURE]


def test_one_held_out_set_per_source_including_untrained_ones() -> None:
    config = parse_config(
        {
            "model": {"seed": 0},
            "tasks": {"seed": 7, "mixture": [{"source": "add"}]},
            "eval": {"num_tasks": 12, "sources": ["add", "copy", "reverse"]},
        }
    )
    held = HeldOut(config)
    assert held.per_source and list(held.sets) == ["add", "copy", "reverse"]
    for source, refs in held.sets.items():
        assert len(refs) == 12 and {r.source for r in refs} == {source}
        assert len({(r.seed, r.index) for r in refs}) == 12
    assert len(held.refs) == 36 and held.refs == HeldOut(config).refs  # fixed
    training = TaskStream(config.tasks, config.model.seed).next_refs(1000)
    assert not {r.seed for r in training} & held.seeds
    copy_ref = held.sets["copy"][0]
    assert held.is_held_out(copy_ref)  # refused from peers though not in our mixture


@pytest.mark.parametrize(
    ("sources", "message"),
    [([], "at least one"), (["add", "add"], "unique"), (["add", "sum"], "unknown task source")],
)
def test_bad_eval_sources_are_refused_at_load(sources: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=rf"eval\.sources.*{message}"):
        parse_config({"eval": {"sources": sources}}, "n.toml")


def test_per_source_results_pool_by_size() -> None:
    results = {
        "add": EvalResult(accuracy=0.25, n=4, seconds=1.0, finished=1.0),
        "copy": EvalResult(accuracy=1.0, n=12, seconds=2.0, finished=0.5),
    }
    pooled = combine_results(results)
    assert pooled.n == 16 and pooled.seconds == 3.0
    assert pooled.accuracy == pytest.approx((1 + 12) / 16)
    assert pooled.finished == pytest.approx((4 + 6) / 16)
    record = eval_record(results, 5, per_source=True)
    assert record["accuracy"] == pytest.approx(0.8125) and record["policy_version"] == 5
    assert record["samples"] == 0  # greedy; a sampled evaluation says how many per task
    assert eval_record(results, 5, samples=4)["samples"] == 4
    assert record["sources"] == {
        "add": {"accuracy": 0.25, "n": 4},
        "copy": {"accuracy": 1.0, "n": 12},
    }
    assert "sources" not in eval_record({MIXTURE: results["add"]}, 0)
    assert combine_results({MIXTURE: results["copy"]}) == results["copy"]
    with pytest.raises(ValueError):
        combine_results({})


def test_modal_share_counts_nones_in_the_whole() -> None:
    assert modal_share(["1", "2", "1", None]) == ("1", 0.5)
    assert modal_share(["2", "1"]) == ("2", 0.5)  # the first seen among equals
    assert modal_share([None, None]) == (None, 0.0)
    assert modal_share([]) == (None, 0.0)


def test_the_record_says_what_a_constant_answer_explains() -> None:
    """A policy answering "1" everywhere on a set whose gold is "1" for 3 of 4 tasks: the
    record shows its accuracy is the constant answer's (what the real-model gcd and
    letter_counting held-out sets turned out to measure, docs/real_swarm.md)."""
    gcd = EvalResult(accuracy=0.75, n=4, answers=("1", "1", "1", "1"), golds=("1", "1", "3", "1"))
    letters = EvalResult(
        accuracy=0.5, n=4, answers=("2", "5", None, "2"), golds=("2", "4", "5", "1")
    )
    record = eval_record({"gcd": gcd, "letters": letters}, 1, per_source=True)
    assert record["sources"]["gcd"] == {
        "accuracy": 0.75,
        "n": 4,
        "constant_answer_accuracy": 0.75,
        "constant_answer": "1",
        "modal_answer": "1",
        "modal_answer_share": 1.0,
    }
    assert record["sources"]["letters"]["constant_answer_accuracy"] == 0.25
    assert record["sources"]["letters"]["modal_answer"] == "2"
    assert record["sources"]["letters"]["modal_answer_share"] == 0.5
    # pooled: "1" is 4 of 8 answers and 4 of 8 golds
    assert record["modal_answer"] == "1" and record["modal_answer_share"] == 0.5
    assert record["constant_answer_accuracy"] == 0.5
    rambling = EvalResult(accuracy=0.0, n=2, answers=("x" * 500,) * 2, golds=("1", "2"))
    assert eval_record({MIXTURE: rambling}, 0)["modal_answer"] == "x" * MODAL_ANSWER_CHARS
    # a learner that reports no answers (simnet's stub) keeps the old record
    assert "modal_answer" not in eval_record({MIXTURE: EvalResult(accuracy=1.0, n=2)}, 0)


def test_the_record_takes_the_scored_constant_where_the_learner_computed_it() -> None:
    """Partial credit: the learner's best constant (here 0.4, above the 1-in-4 share of
    the most common gold) is what the record says; pooled, each set's own by size."""
    spell = EvalResult(
        accuracy=0.3,
        n=4,
        answers=("a", "b", "c", "d"),
        golds=("ab", "cd", "ef", "gh"),
        constant=("cd", 0.4),
    )
    gcd = EvalResult(
        accuracy=0.5, n=8, answers=("1",) * 8, golds=("1",) * 6 + ("2",) * 2, constant=("1", 0.75)
    )
    record = eval_record({"spell": spell, "gcd": gcd}, 1, per_source=True)
    assert record["sources"]["spell"]["constant_answer_accuracy"] == 0.4
    assert record["sources"]["spell"]["constant_answer"] == "cd"
    assert record["constant_answer_accuracy"] == round((0.4 * 4 + 0.75 * 8) / 12, 6)
    assert "constant_answer" not in record  # one answer per source: none to name
    unscored = EvalResult(accuracy=0.0, n=2, answers=("x", "y"), golds=("1", "2"))
    assert "constant_answer_accuracy" in eval_record({"a": unscored, "b": gcd}, 1)
    assert eval_record({"a": unscored, "b": gcd}, 1)["constant_answer_accuracy"] == round(
        7 / 10, 6
    )  # a set without a scored constant: the exact-match share over all golds


def test_peers_groups_of_our_held_out_tasks_are_refused(tmp_path: Path) -> None:
    node = stub_node(stub_config(tmp_path, "evaluator"), MemoryNetwork("held-out"))
    peer = Identity.from_seed(b"\x21" * 32)
    task = make_task(node.held_out.refs[0])
    group = RolloutGroup(
        task.ref, task.prompt, (task.answer, task.answer + "9"), (1.0, 0.0), "m", 0
    )

    async def scenario() -> None:
        await node.take(envelope_of(node, peer, RolloutBatch((group,)), 0, 1))
        await node.take(envelope_of(node, peer, batch(0, 0), 0, 2))  # an ordinary task

    asyncio.run(scenario())
    assert node.drops["held_out_task"] == 1
    assert not node.peer_faults  # not the peer's fault: it cannot know our seed
    assert len(node.pool) == 1


def test_a_real_node_evaluates_and_keeps_recent_samples(tmp_path: Path) -> None:
    from node.policy_learner import PolicyLearner
    from node.runner import Node

    config = apply_overrides(
        stub_config(tmp_path, "real"),
        {
            "eval": {"every": 3, "num_tasks": 6},
            "node": {"samples_keep": 4, "checkpoint_every": 100},
            "sapo": {"external_groups": 0, "local_groups": 2},
            "sampler": {"group_size": 4, "max_new_tokens": 2},
        },
        "test",
    )
    stub = stub_node(config, MemoryNetwork("real-eval"))
    node = Node(config, stub.gossip, PolicyLearner(config), stub.clock)
    asyncio.run(node.run(7))
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    evaluated = [r["round"] for r in records if r["eval"] is not None]
    assert evaluated == [1, 4, 7]  # at the start of rounds 0, 3, 6
    first = records[0]["eval"]
    assert first["n"] == 6 and 0.0 <= first["accuracy"] <= 1.0
    assert first["policy_version"] == 0  # before any training
    samples = read_samples(Path(config.node.data_dir) / "samples.jsonl")
    assert 4 <= len(samples) <= 8  # 14 groups written, trimmed to the newest 4 past 8
    assert samples[-1]["round"] == 7
    assert all(len(s["completions"]) == len(s["rewards"]) == 4 for s in samples)


def test_samples_log_is_bounded_and_skips_a_torn_line(tmp_path: Path) -> None:
    log = SamplesLog(tmp_path / "s.jsonl", keep=3)
    for i in range(20):
        log.append([{"i": i}])
    assert [r["i"] for r in read_samples(tmp_path / "s.jsonl")][-1] == 19
    assert len(read_samples(tmp_path / "s.jsonl")) <= 6
    with (tmp_path / "s.jsonl").open("a") as f:
        f.write('{"i": 2')
    assert read_samples(tmp_path / "s.jsonl")[-1]["i"] == 19
    assert read_samples(tmp_path / "s.jsonl", last=2)[-1]["i"] == 19


def test_a_real_node_scores_each_held_out_source(tmp_path: Path) -> None:
    from node.policy_learner import PolicyLearner
    from node.runner import Node

    config = apply_overrides(
        stub_config(tmp_path, "per-source"),
        {
            "eval": {"every": 2, "num_tasks": 5, "sources": ["add", "copy"]},
            "node": {"checkpoint_every": 100},
            "sapo": {"external_groups": 0, "local_groups": 1},
            "sampler": {"group_size": 2, "max_new_tokens": 3},
        },
        "test",
    )
    stub = stub_node(config, MemoryNetwork("per-source"))
    node = Node(config, stub.gossip, PolicyLearner(config), stub.clock)
    asyncio.run(node.run(3))
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    evaluated = [r["eval"] for r in records if r["eval"] is not None]
    assert len(evaluated) == 2  # at the start of rounds 0 and 2
    for entry in evaluated:
        sources = entry["sources"]
        assert list(sources) == ["add", "copy"] and entry["n"] == 10
        assert all(s["n"] == 5 and 0.0 <= s["accuracy"] <= 1.0 for s in sources.values())
        mean = (sources["add"]["accuracy"] + sources["copy"]["accuracy"]) / 2
        assert entry["accuracy"] == pytest.approx(mean, abs=1e-6)


def test_sampled_evaluation_scores_every_completion_reproducibly(tmp_path: Path) -> None:
    from node.policy_learner import PolicyLearner

    config = apply_overrides(
        stub_config(tmp_path, "sampled"),
        {"eval": {"samples": 4}, "sampler": {"group_size": 2, "max_new_tokens": 3}},
        "test",
    )
    learner = PolicyLearner(config)
    refs = HeldOut(config).refs[:5]
    sampled = learner.evaluate(refs, 3, samples=4)
    assert sampled.n == 20 and 0.0 <= sampled.accuracy <= 1.0
    again = learner.evaluate(refs, 3, samples=4)
    assert (again.accuracy, again.finished) == (sampled.accuracy, sampled.finished)
    assert again.answers == sampled.answers and len(sampled.answers) == 20
    assert sampled.golds == tuple(make_task(r).answer for r in refs)
    greedy = learner.evaluate(refs, 3)
    assert greedy.n == 5 and len(greedy.answers) == 5  # greedy: one answer per task


def test_stub_sampled_accuracy_is_its_expected_pass_rate() -> None:
    from simnet.stub import StubLearner

    config = parse_config({"model": {"seed": 0}, "tasks": {"seed": 3}})
    learner = StubLearner(8, config.rewards, skill=0.3)
    refs = HeldOut(config).refs
    expected = sum(learner.p_task(make_task(r).prompt) for r in refs) / len(refs)
    assert learner.evaluate(refs, 3, samples=8).accuracy == pytest.approx(expected)
    assert learner.evaluate(refs, 3).accuracy == pytest.approx(0.0)  # p < 1/2 everywhere


def test_a_real_node_leaves_out_own_tasks_that_do_not_build(tmp_path: Path) -> None:
    """Own references whose item raises or never builds (a reasoning-gym-like source,
    built in the scoring worker under `rescore_timeout_s`): round 0 has no own group at
    all and round 1 one; both train on and count what they left out by reason, and an
    evaluation scores what it could build."""
    from node.policy_learner import PolicyLearner
    from node.runner import Node
    from swarm.messages import TaskRef
    from tests.rewards import slow_source

    config = apply_overrides(
        stub_config(tmp_path, "unbuilt"),
        {
            "eval": {"every": 0},
            "node": {"checkpoint_every": 100},
            "rewards": {"rescore_timeout_s": 2.0, "timeout_s": 1.0},
            "sapo": {"external_groups": 0, "local_groups": 2},
            "sampler": {"group_size": 2, "max_new_tokens": 2},
        },
        "test",
    )
    hang = slow_source.HANG_BUILD
    rounds = iter(
        [[TaskRef(hang, 0, 10), TaskRef(hang, 0, 1)], [TaskRef("add", 0, 0), TaskRef(hang, 0, 20)]]
    )
    stub = stub_node(config, MemoryNetwork("unbuilt"))
    learner = PolicyLearner(config)
    node = Node(config, stub.gossip, learner, stub.clock)
    node.own_samples.tasks.next_refs = lambda n: next(rounds, [])  # type: ignore[method-assign]
    asyncio.run(node.run(2))
    records = read_metrics(Path(config.node.data_dir) / "metrics.jsonl")
    assert [r["local_groups"] for r in records] == [0, 1]
    assert records[0]["own_tasks_skipped"] == {"task_build_error": 1, "task_build_timeout": 1}
    assert records[1]["own_tasks_skipped"] == {"task_build_error": 1}
    assert records[1]["mean_local_reward"] is not None
    result = learner.evaluate([TaskRef("add", 0, 0), TaskRef(hang, 0, 2), TaskRef(hang, 0, 20)], 2)
    assert (result.n, result.skipped) == (2, 1)
    assert eval_record({"mixture": result}, 1)["skipped"] == 1
    # The set's best constant is scored once for its life, not at every evaluation.
    import node.policy_learner as policy_learner

    calls: list[int] = []
    real = policy_learner.best_constant

    def counted(tasks, config):  # type: ignore[no-untyped-def]
        calls.append(len(tasks))
        return real(tasks, config)

    policy_learner.best_constant = counted  # type: ignore[assignment]
    try:
        refs = [TaskRef("add", 0, 1), TaskRef("add", 0, 2)]
        first, again = learner.evaluate(refs, 2), learner.evaluate(refs, 2)
    finally:
        policy_learner.best_constant = real  # type: ignore[assignment]
    assert calls == [2] and first.constant == again.constant is not None
