"""simnet's shared pure work: each memo gives what the function itself gives, errors are
never cached, own signatures skip only the check that cannot fail, patches come off."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

import gossip.layer
import node.rescore
import node.workers
import simnet.shared
import simnet.stub
import swarm.envelope
from rewards.registry import score_group
from rewards.tasks import make_task
from simnet.shared import Recent, shared_pure_work
from swarm.codec import Limits
from swarm.config import RewardsConfig
from swarm.envelope import decode_envelope, seal
from swarm.errors import WireError
from swarm.identity import Identity
from swarm.messages import TaskRef

LIMITS = Limits(max_bin_len=1 << 16, max_array_len=16, max_map_len=16, max_depth=2)


def test_recent_keeps_the_last_window_to_twice_the_window() -> None:
    cache = Recent(3)
    for i in range(7):
        cache.put(i, str(i))
    # 0-2 went old, then 3-5 went old (dropping 0-2); 6 is young.
    assert [cache.get(i) for i in (0, 1, 2)] == [None, None, None]
    assert cache.get(6) == "6" and len(cache) == 4
    assert cache.get(3) == "3"  # an old hit moves to the young generation
    assert 3 in cache.young and 3 not in cache.old
    with pytest.raises(ValueError):
        Recent(0)


def test_patches_come_off_on_exit_and_on_error() -> None:
    before = [getattr(owner, name) for owner, name in simnet.shared._TARGETS]
    with shared_pure_work():
        assert node.rescore.make_task is not make_task
        assert Identity.sign is not before[-1]
        with pytest.raises(RuntimeError, match="already active"), shared_pure_work():
            pass
    assert [getattr(owner, name) for owner, name in simnet.shared._TARGETS] == before
    with pytest.raises(KeyError), shared_pure_work():
        raise KeyError("boom")
    assert [getattr(owner, name) for owner, name in simnet.shared._TARGETS] == before
    assert gossip.layer.decode_envelope is decode_envelope
    assert node.workers.rescore_group is node.rescore.rescore_group


def test_make_task_memo_returns_the_same_task_and_never_caches_errors() -> None:
    ref = TaskRef("add", 7, 3)
    with shared_pure_work():
        first = node.rescore.make_task(ref)
        assert first == make_task(ref)
        assert simnet.stub.make_task(TaskRef("add", 7, 3)) is first  # one cache, by value
        for _ in range(2):  # raised each time, never remembered
            with pytest.raises(KeyError):
                node.rescore.make_task(TaskRef("no-such-source", 0, 0))


def test_score_memo_gives_the_scores_and_scores_each_distinct_completion_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[list[str]] = []

    def spy(task: Any, completions: list[str], config: Any) -> list[float]:
        calls.append(list(completions))
        return score_group(task, completions, config)

    monkeypatch.setattr(node.rescore, "score_group", spy)
    monkeypatch.setattr(simnet.stub, "score_group", spy)
    config = RewardsConfig()
    task = make_task(TaskRef("add", 1, 2))
    completions = [task.answer, "nope", task.answer, f"{task.answer}x", "nope"]
    with shared_pure_work():
        memo_task = node.rescore.make_task(task.ref)
        got = simnet.stub.score_group(memo_task, completions[:2], config)
        assert got == score_group(task, completions[:2], config)
        # Another node's equal config; scores already known are not computed again.
        again = node.rescore.score_group(memo_task, completions, RewardsConfig())
    assert again == score_group(task, completions, config)
    assert calls == [[task.answer, "nope"], [f"{task.answer}x"]]


def test_score_memo_always_calls_a_time_limited_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def spy(task: Any, completions: list[str], config: Any) -> list[float]:
        calls.append(list(completions))
        return [0.5] * len(completions)

    @dataclass(frozen=True)
    class Slow:
        slow: bool = True

    monkeypatch.setattr(node.rescore, "score_group", spy)
    monkeypatch.setattr(simnet.shared, "get_correctness", lambda name: Slow())
    task = make_task(TaskRef("add", 1, 2))
    with shared_pure_work():
        for _ in range(2):
            assert node.rescore.score_group(task, ["1", "1"], RewardsConfig()) == [0.5, 0.5]
    assert calls == [["1", "1"], ["1", "1"]]


def _sealed(identity: Identity, payload: bytes = b"payload") -> Any:
    return seal(identity, kind="hello", swarm_id="s", seq=1, policy_version=0, payload=payload)


def test_own_signatures_skip_only_the_check_that_cannot_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked: list[str] = []
    real_verify = swarm.envelope.verify

    def spy(peer_id: str, message: bytes, signature: bytes) -> None:
        checked.append(peer_id)
        real_verify(peer_id, message, signature)

    monkeypatch.setattr(swarm.envelope, "verify", spy)
    alice, mallory = Identity.from_seed(b"a" * 32), Identity.from_seed(b"m" * 32)
    outside = _sealed(alice, b"signed before sharing started")
    with shared_pure_work():
        own = _sealed(alice)
        assert decode_envelope(own.encode(), LIMITS, "s").signature == own.signature
        assert checked == []  # made here by alice's key: verifying cannot fail
        # Signed outside the block: checked for real.
        decode_envelope(outside.encode(), LIMITS, "s")
        assert checked == [alice.peer_id]
        # Altered bytes, a flipped signature, or mallory's signature claimed as alice's:
        # all checked for real and refused.
        forged = own.__class__(
            own.version, own.kind, own.swarm_id, own.sender, own.seq, own.policy_version,
            b"other payload", own.signature,
        )  # fmt: skip
        flipped = own.__class__(
            own.version, own.kind, own.swarm_id, own.sender, own.seq, own.policy_version,
            own.payload, bytes([own.signature[0] ^ 1]) + own.signature[1:],
        )  # fmt: skip
        by_mallory = _sealed(mallory)
        claimed = own.__class__(
            own.version, own.kind, own.swarm_id, alice.peer_id, own.seq, own.policy_version,
            own.payload, by_mallory.signature,
        )  # fmt: skip
        for bad in (forged, flipped, claimed):
            checked.clear()
            with pytest.raises(WireError) as refused:
                decode_envelope(bad.encode(), LIMITS, "s")
            assert refused.value.reason == "bad_signature" and checked == [alice.peer_id]
    checked.clear()
    decode_envelope(own.encode(), LIMITS, "s")  # after the block: checked again
    assert checked == [alice.peer_id]
