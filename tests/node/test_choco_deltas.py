"""The CHOCO exchange end to end (`node.choco_deltas`): streams and keyframes, exact
copies on both sides, gaps and resync, restart, refusals, hostile peers, contraction."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from torch import nn

from node.choco_deltas import ChocoExchange
from node.deltas import DeltaExchange, model_params
from node.rescore import Refused
from policy.aggregation import global_norm
from policy.choco import consensus_distance
from policy.compression import compress
from policy.delta_codec import encode_packet
from swarm.config.deltas import DeltasConfig
from swarm.messages import DeltaPacket

FAMILY = "fam"


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one torch thread is faster than two contended ones."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(**overrides: object) -> DeltasConfig:
    settings: dict[str, object] = {
        "enabled": True,
        "scheme": "choco",
        "every_k_steps": 1,
        "chunk_size": 256,
        "density": 1 / 16,
        "bits": 4,
        "max_staleness": 4,
        "keyframe_every": 4,
        "consensus_step": 0.1,
        **overrides,
    }
    if settings["scheme"] != "choco":  # choco's knobs would do nothing, and are refused
        settings = {k: v for k, v in settings.items() if k not in _CHOCO_ONLY}
    return DeltasConfig.model_validate(settings)


_CHOCO_ONLY = ("keyframe_every", "consensus_step")


def _params(seed: int = 0) -> dict[str, torch.Tensor]:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8))
    return model_params(model)


def _nodes(n: int, **overrides: object) -> list[tuple[dict[str, torch.Tensor], ChocoExchange]]:
    out = []
    for _ in range(n):
        params = _params(0)  # one family: the same initial weights
        out.append((params, ChocoExchange(_config(**overrides), FAMILY, params)))
    return out


def _train(params: dict[str, torch.Tensor], gen: torch.Generator, scale: float = 1e-2) -> None:
    for p in params.values():
        p.add_(torch.randn(p.shape, generator=gen) * scale)


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor] | None) -> bool:
    return b is not None and all(torch.equal(a[n], b[n]) for n in a)


def test_stream_metadata_and_keyframe_cadence() -> None:
    [(params, ex)] = _nodes(1)
    gen = torch.Generator().manual_seed(0)
    frames = []
    for step in range(1, 10):
        _train(params, gen)
        packet = ex.maybe_make_packet(step, params)
        assert packet is not None
        m = packet.meta
        assert m["scheme"] == "choco" and m["stream"] == ex.stream and m["version"] == str(step)
        assert int(m["seq"]) == step and packet.base_version == step - 1
        frames.append(m["frame"])
        assert packet.encoding == ("dense_fp16" if m["frame"] == "key" else "topk")
    assert frames == ["key", "diff", "diff", "diff", "key", "diff", "diff", "diff", "key"]


def test_receivers_copy_equals_the_senders_estimate_bit_for_bit() -> None:
    (a_params, a), (b_params, b) = _nodes(2)
    gen = torch.Generator().manual_seed(1)
    for step in range(1, 7):
        _train(a_params, gen)
        packet = a.maybe_make_packet(step, a_params)
        assert packet is not None
        b.receive("a", step, packet, arrival_round=step)
        b.merge_into(b_params, own_round=step)
        assert _equal(a.own_estimate, b.estimate_of("a"))


def test_a_gap_stops_the_copy_until_the_next_keyframe() -> None:
    (a_params, a), (b_params, b) = _nodes(2)
    gen = torch.Generator().manual_seed(2)
    stats = []
    for step in range(1, 10):
        _train(a_params, gen)
        packet = a.maybe_make_packet(step, a_params)
        assert packet is not None
        if step != 3:  # seq 3 (a diff) is lost
            b.receive("a", step, packet, arrival_round=step)
        before = {n: t.clone() for n, t in b_params.items()}
        stats.append(b.merge_into(b_params, own_round=step))
        moved = not all(torch.equal(before[n], b_params[n]) for n in b_params)
        if 4 <= step < 5:  # out of sync: no consensus step with a's stale copy
            assert b.estimate_of("a") is None and not moved
    assert [s.gaps for s in stats] == [0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert stats[4].resyncs == 1  # seq 5 is the keyframe
    assert _equal(a.own_estimate, b.estimate_of("a"))


def test_reordering_within_one_merge_is_harmless() -> None:
    (a_params, a), (b_params, b) = _nodes(2)
    gen = torch.Generator().manual_seed(3)
    packets = []
    for step in range(1, 4):
        _train(a_params, gen)
        packet = a.maybe_make_packet(step, a_params)
        assert packet is not None
        packets.append(packet)
    for packet in reversed(packets):
        b.receive("a", 3, packet, arrival_round=3)
    stats = b.merge_into(b_params, own_round=3)
    assert (stats.resyncs, stats.applied, stats.gaps) == (1, 2, 0)
    assert _equal(a.own_estimate, b.estimate_of("a"))


def test_a_restarted_node_resumes_and_both_sides_resync() -> None:
    (a_params, a), (b_params, b) = _nodes(2)
    gen = torch.Generator().manual_seed(4)
    for step in range(1, 3):
        for params, ex, name, other in ((a_params, a, "a", b), (b_params, b, "b", a)):
            _train(params, gen)
            packet = ex.maybe_make_packet(step, params)
            assert packet is not None
            other.receive(name, step, packet, arrival_round=step)
        a.merge_into(a_params, own_round=step)
        b.merge_into(b_params, own_round=step)
    state = a.state_tensors()
    old_stream = a.stream
    restarted = ChocoExchange(_config(), FAMILY, a_params)
    restarted.load_state_tensors(state)
    assert restarted.stream != old_stream and restarted.last_step == 2
    packet = restarted.maybe_make_packet(3, a_params)
    assert packet is not None and packet.meta["frame"] == "key"
    b.receive("a", 3, packet, arrival_round=3)
    assert b.merge_into(b_params, own_round=3).resyncs == 1
    assert _equal(restarted.own_estimate, b.estimate_of("a"))
    # b saw a new stream: its next share is a keyframe although not due by the cadence
    _train(b_params, gen)
    packet = b.maybe_make_packet(3, b_params)
    assert packet is not None and packet.meta["frame"] == "key"
    restarted.receive("b", 3, packet, arrival_round=3)
    restarted.merge_into(a_params, own_round=3)
    assert _equal(b.own_estimate, restarted.estimate_of("b"))
    # b's stream is old (seq 3): the restarted node is the newcomer and does not key again
    packet = restarted.maybe_make_packet(4, a_params)
    assert packet is not None and packet.meta["frame"] == "diff"
    # a checkpoint of the `merge` scheme does not stop a CHOCO node from resuming
    merge_state = DeltaExchange(_config(scheme="merge"), FAMILY, a_params).state_tensors()
    restarted.load_state_tensors(merge_state)
    assert restarted.maybe_make_packet(6, a_params) is not None


def test_refusals() -> None:
    (a_params, a), (_, b) = _nodes(2)
    key = a.maybe_make_packet(1, a_params)
    assert key is not None

    def reason(packet: DeltaPacket, into: ChocoExchange | DeltaExchange = b) -> str:
        with pytest.raises(Refused) as info:
            into.receive("x", 1, packet, arrival_round=1)
        return info.value.reason

    assert reason(replace(key, model_family="other")) == "wrong_family"
    assert reason(replace(key, meta={"version": "1"})) == "wrong_scheme"
    merge = DeltaExchange(_config(scheme="merge"), FAMILY, a_params)
    assert reason(key, merge) == "wrong_scheme"  # a keyframe holds weights, not a delta
    assert reason(replace(key, base_version=5)) == "bad_delta"
    assert reason(replace(key, meta={**key.meta, "seq": "-1"})) == "bad_delta"
    assert reason(replace(key, meta={**key.meta, "stream": "../x"})) == "bad_delta"
    diff_as_key = compress(
        {n: torch.zeros_like(t) for n, t in a_params.items()},
        None,
        density=1 / 16,
        bits=4,
        chunk_size=256,
    )[0]
    assert reason(replace(key, encoding="topk", tensors=encode_packet(diff_as_key))) == "bad_delta"
    dense, _ = compress(dict(a_params), None, encoding="dense_fp16")
    values = dense.arrays["values"].clone()
    values[3] = float("inf")
    poisoned = encode_packet(replace(dense, arrays={"values": values}))
    assert reason(replace(key, tensors=poisoned)) == "non_finite"


def test_a_hostile_keyframe_moves_honest_nodes_by_a_bounded_step() -> None:
    """Three honest peers near us, one whose 'estimate' is our weights x 1000: its term is
    clipped to 2x the median gap; no term exceeds that bound, so the step is at most
    gamma * 4 * 2 / 5 x median, where unclipped it would be about gamma * 1000 |x| / 5."""
    nodes = _nodes(4)
    gen = torch.Generator().manual_seed(5)
    target_params, target = _params(0), ChocoExchange(_config(), FAMILY, _params(0))
    for i, (params, ex) in enumerate(nodes):
        _train(params, gen)
        packet = ex.maybe_make_packet(1, params)
        assert packet is not None
        if i == 3:
            huge = {n: t * 1000 for n, t in params.items()}
            compressed, _ = compress(huge, None, encoding="dense_fp16")
            packet = replace(packet, tensors=encode_packet(compressed))
        target.receive(f"n{i}", 1, packet, arrival_round=1)
    target.maybe_make_packet(1, target_params)
    stats = target.merge_into(target_params, own_round=1)
    c = stats.consensus
    assert c.peers == 4 and c.clipped == 1 and c.median_gap is not None
    assert stats.applied_norm <= 0.1 * 4 * 2 / 5 * c.median_gap * 1.001
    assert stats.applied_norm < 1e-3 * 0.1 * 1000 * global_norm(target_params) / 5
    assert all(torch.isfinite(t).all() for t in target_params.values())


def test_estimates_are_bounded_and_the_least_recent_is_evicted() -> None:
    nodes = _nodes(4)
    (own_params, own) = _params(0), ChocoExchange(_config(max_estimates=2), FAMILY, _params(0))
    for i, (params, ex) in enumerate(nodes[:3]):
        packet = ex.maybe_make_packet(1, params)
        assert packet is not None
        own.receive(f"n{i}", 1, packet, arrival_round=i)
        own.merge_into(own_params, own_round=i)
    held = sorted(s for s, p in own.peers.items() if p.estimate is not None)
    assert held == ["n1", "n2"]


def test_choco_contracts_where_merge_and_silos_do_not() -> None:
    """Four nodes, each trained by its own random walk: CHOCO holds their spread far below
    the silos' and below today's merge (which shares training, not positions)."""

    def run(scheme: str | None) -> float:
        nodes = []
        for _ in range(4):
            params = _params(0)
            config = _config(scheme=scheme or "merge", mixing_weight=0.5, consensus_step=0.2)
            ex: ChocoExchange | DeltaExchange = (
                ChocoExchange(config, FAMILY, params)
                if scheme == "choco"
                else DeltaExchange(config, FAMILY, params)
            )
            nodes.append((params, ex))
        gens = [torch.Generator().manual_seed(10 + i) for i in range(4)]
        for step in range(1, 61):
            packets = []
            for (params, ex), gen in zip(nodes, gens, strict=True):
                _train(params, gen, 1e-3)
                packets.append(ex.maybe_make_packet(step, params) if scheme else None)
            for i, (params, ex) in enumerate(nodes):
                if scheme is None:
                    continue
                for j, packet in enumerate(packets):
                    if j != i and packet is not None:
                        ex.receive(f"n{j}", step, packet, arrival_round=step)
                ex.merge_into(params, own_round=step)
        return consensus_distance([p for p, _ in nodes])

    silo, merge, choco = run(None), run("merge"), run("choco")
    print("consensus distance after 60 steps: silo", silo, "merge", merge, "choco", choco)
    assert choco < 0.3 * silo
    assert choco < 0.5 * merge


def test_consensus_reference() -> None:
    """a stands still, b trains; both share. `current` compares a's copy with b's
    estimate after b's share (pulling b back toward where both were); `previous` with
    b's estimate before it, which is a's copy up to a's float16 rounding: no real move."""

    def moved(reference: str) -> float:
        (a_params, a), (b_params, b) = _nodes(2, consensus_reference=reference)
        for step in (1, 2):
            if step == 2:
                _train(b_params, torch.Generator().manual_seed(6))
            pa, pb = a.maybe_make_packet(step, a_params), b.maybe_make_packet(step, b_params)
            assert pa is not None and pb is not None
            b.receive("a", step, pa, arrival_round=step)
            stats = b.merge_into(b_params, own_round=step)
        assert stats.consensus.peers == 1
        return stats.applied_norm

    current, previous = moved("current"), moved("previous")
    assert current > 1e-2
    assert previous < 0.01 * current
