"""Task streams: deterministic, weighted, resumable."""

from __future__ import annotations

from collections import Counter

import pytest

from rewards.mixture import TaskStream
from swarm.config.tasks import TasksConfig, TaskSpec


def _config(seed: int = 0) -> TasksConfig:
    return TasksConfig(
        mixture=[TaskSpec(source="add", weight=3.0), TaskSpec(source="copy", weight=1.0)],
        seed=seed,
    )


def test_stream_is_deterministic_and_chunking_does_not_matter() -> None:
    a = TaskStream(_config(), node_seed=5)
    b = TaskStream(_config(), node_seed=5)
    assert a.next_refs(3) + a.next_refs(5) == b.next_refs(8)
    assert a.cursor == b.cursor == 8


def test_streams_differ_by_node_and_config_seed() -> None:
    base = TaskStream(_config(), node_seed=5).next_refs(20)
    assert TaskStream(_config(), node_seed=6).next_refs(20) != base
    assert TaskStream(_config(seed=1), node_seed=5).next_refs(20) != base


def test_weights_are_respected() -> None:
    refs = TaskStream(_config(), node_seed=0).next_refs(4000)
    counts = Counter(r.source for r in refs)
    assert 0.70 < counts["add"] / 4000 < 0.80
    assert len({r.index for r in refs}) == 4000


def test_state_dict_resumes_exactly_and_refuses_other_streams() -> None:
    a = TaskStream(_config(), node_seed=1)
    a.next_refs(7)
    state = a.state_dict()
    expected = a.next_refs(4)
    b = TaskStream(_config(), node_seed=1)
    b.load_state_dict(state)
    assert b.next_refs(4) == expected
    other = TaskStream(_config(), node_seed=2)
    with pytest.raises(ValueError, match="stream seed"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="cursor"):
        b.load_state_dict({"seed": b.seed, "cursor": -1})


def test_unknown_source_fails_at_config_load_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="unknown task source 'nope': use a built-in source"):
        TasksConfig(mixture=[TaskSpec(source="nope")])
