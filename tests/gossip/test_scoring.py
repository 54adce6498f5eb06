"""Peer scores: penalties, ignore periods that double, forgiveness, decay, credit, bounds;
and the gossip layer dropping an ignored peer's messages until it is forgiven."""

from __future__ import annotations

import pytest

from gossip.layer import Gossip
from gossip.memory import MemoryNetwork, MemoryTransport
from gossip.scoring import WEIGHTS, PeerScores, weight_of
from swarm.config.network import GossipConfig, MemoryTransportConfig, ScoringConfig
from swarm.envelope import seal
from swarm.identity import Identity
from swarm.messages import Hello, encode_payload
from swarm.transport import TransportMessage, peers_topic

SWARM = "score-swarm"
PEERS = peers_topic(SWARM)


class ManualClock:
    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def scores(**overrides: float) -> tuple[PeerScores, ManualClock]:
    clock = ManualClock()
    return PeerScores(ScoringConfig(**overrides), clock), clock


def test_penalties_add_up_to_an_ignore_period_that_ends_in_forgiveness() -> None:
    s, clock = scores(ignore_threshold=20, ignore_s=100, max_ignore_s=1000)
    assert not s.penalize("p", "prompt_mismatch")  # -5
    assert not s.penalize("p", "prompt_mismatch")
    assert not s.penalize("p", "prompt_mismatch")
    assert s.score("p") == pytest.approx(-15, abs=1e-6)
    assert not s.is_ignored("p")
    assert s.penalize("p", "prompt_mismatch")  # -20: ignored now
    assert s.is_ignored("p") and not s.in_good_standing("p")
    clock.t += 99
    assert s.is_ignored("p")
    clock.t += 2
    assert not s.is_ignored("p")
    assert s.score("p") == 0.0
    assert s.ignores_started == 1 and s.forgiven == 1


def test_repeat_offences_double_the_period_up_to_the_cap() -> None:
    s, clock = scores(ignore_threshold=10, ignore_s=100, max_ignore_s=350, half_life_s=1e9)
    periods = []
    for _ in range(4):
        start = clock.t
        s.penalize("p", "malformed")  # weight 10: ignored at once
        assert s.is_ignored("p")
        while s.is_ignored("p"):
            clock.t += 1
        periods.append(clock.t - start)
    # Offences also halve every max_ignore_s, so the doubling is a little under 2x.
    assert periods[0] == pytest.approx(100, abs=1)
    assert periods[1] == pytest.approx(200, abs=1)
    assert periods[2] == pytest.approx(350, abs=1)  # capped
    assert periods[3] == pytest.approx(350, abs=1)


def test_scores_decay_so_rare_faults_of_an_honest_peer_never_add_up() -> None:
    s, clock = scores(ignore_threshold=20, half_life_s=60)
    for _ in range(50):
        s.penalize("honest", "unknown_task")  # weight 1, once a minute
        clock.t += 60
    assert not s.is_ignored("honest")
    assert s.score("honest") > -2.0
    # The same faults in a burst do add up.
    for _ in range(25):
        s.penalize("burst", "unknown_task")
    assert s.is_ignored("burst")


def test_reasons_honest_peers_cause_never_move_a_score() -> None:
    s, _ = scores()
    for reason in (
        "duplicate",
        "stale",
        "stale_version",
        "zero_variance",
        "reassembly_expired",
        "nondeterministic_task",
    ):
        assert WEIGHTS[reason] == 0.0
        for _ in range(100):
            s.penalize("p", reason)
    assert s.score("p") == 0.0 and not s.is_ignored("p")
    assert weight_of("some_new_reason") > 0


def test_credit_is_capped_and_banked_against_later_penalties() -> None:
    s, _ = scores(max_credit=10, ignore_threshold=20, half_life_s=1e9)
    for _ in range(100):
        s.credit("p")
    assert s.score("p") == 10.0
    for _ in range(5):
        s.penalize("p", "prompt_mismatch")
    assert not s.is_ignored("p")  # 10 - 25 = -15
    s.penalize("p", "prompt_mismatch")
    assert s.is_ignored("p")  # -20


def test_disabled_scoring_ignores_nobody() -> None:
    s, _ = scores(enabled=False)
    for _ in range(10):
        s.penalize("p", "malformed")
    assert not s.is_ignored("p") and s.score("p") == 0.0


def test_memory_is_bounded_and_a_flood_of_fresh_keys_cannot_free_an_offender() -> None:
    s, _ = scores(max_peers=16)
    s.penalize("offender", "malformed")
    s.penalize("offender", "malformed")
    assert s.is_ignored("offender")
    for i in range(1000):
        s.penalize(f"fresh-{i}", "unknown_task")
    assert len(s) == 16
    assert s.is_ignored("offender")


def test_snapshot_lists_low_scores_with_their_reasons() -> None:
    s, _ = scores()
    s.penalize("bad", "forged_rewards")
    s.credit("good")
    snap = s.snapshot()
    assert snap["tracked"] == 2
    assert list(snap["peers"]) == ["bad"]
    assert snap["peers"]["bad"]["reasons"] == {"forged_rewards": 1}


# ---- through the gossip layer ------------------------------------------------------------


def signed_hello(identity: Identity, seq: int, *, swarm_id: str = SWARM) -> bytes:
    payload = encode_payload(Hello("tiny", "fam", 1, ()))
    return seal(
        identity, kind="hello", swarm_id=swarm_id, seq=seq, policy_version=0, payload=payload
    ).encode()


def test_gossip_ignores_a_misbehaving_peer_then_forgives_it() -> None:
    clock = ManualClock()
    me = Identity.from_seed(b"\x01" * 32)
    attacker = Identity.from_seed(b"\x02" * 32)
    honest = Identity.from_seed(b"\x03" * 32)
    config = GossipConfig(scoring=ScoringConfig(ignore_threshold=20, ignore_s=60))
    transport = MemoryTransport(MemoryTransportConfig(), me, network=MemoryNetwork("scores"))
    gossip = Gossip(transport, me, SWARM, config, clock, initial_seq=1)

    def offer(data: bytes) -> bool:
        return gossip.accept(TransportMessage(PEERS, data)) is not None

    # Validly signed, but for another swarm: 5 points each, blamed on the signer.
    for seq in range(1, 5):
        assert not offer(signed_hello(attacker, seq, swarm_id="elsewhere"))
    assert gossip.counters.dropped["wrong_swarm"] == 4
    assert gossip.scores.is_ignored(attacker.peer_id)
    # Now even its valid messages are dropped, and honest peers are unaffected.
    assert not offer(signed_hello(attacker, 10))
    assert gossip.counters.dropped["ignored_peer"] == 1
    assert offer(signed_hello(honest, 1))
    snap = gossip.snapshot()["scores"]
    assert snap["ignored_now"] == 1
    assert snap["peers"][attacker.peer_id]["ignored_messages"] == 1
    # Forgiven after the period: accepted again.
    clock.t += 61
    assert offer(signed_hello(attacker, 11))
    assert gossip.scores.forgiven == 1


def test_node_level_penalties_count_too() -> None:
    clock = ManualClock()
    me = Identity.from_seed(b"\x01" * 32)
    peer = Identity.from_seed(b"\x04" * 32)
    transport = MemoryTransport(MemoryTransportConfig(), me, network=MemoryNetwork("scores2"))
    gossip = Gossip(transport, me, SWARM, GossipConfig(), clock, initial_seq=1)
    for _ in range(4):
        gossip.penalize(peer.peer_id, "forged_rewards")
    assert gossip.scores.is_ignored(peer.peer_id)
    assert gossip.counters.per_peer_drops[peer.peer_id]["forged_rewards"] == 4
    assert gossip.accept(TransportMessage(PEERS, signed_hello(peer, 1))) is None
    assert gossip.counters.dropped["ignored_peer"] == 1
