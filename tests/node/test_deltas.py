"""The delta exchange end to end: sharing cadence, refusals, merging, poisoned peers,
checkpoint state, and the share size of the built-in tiny model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from node.deltas import DeltaExchange, model_params
from node.rescore import Refused
from policy.aggregation import global_norm
from policy.compression import (
    compress,
    decompress,
    dense_fp32_bytes,
    make_layout,
    pack_bits,
    unpack_bits,
)
from policy.delta_codec import decode_packet, encode_packet
from policy.loading import model_family
from policy.tiny import build_tiny_model
from swarm.config.deltas import DeltasConfig
from swarm.messages import DeltaPacket

FAMILY = "fam"


def _config(**overrides: object) -> DeltasConfig:
    settings: dict[str, object] = {
        "enabled": True,
        "every_k_steps": 2,
        "chunk_size": 256,
        "density": 1 / 16,
        "bits": 4,
        "max_staleness": 4,
    }
    return DeltasConfig.model_validate({**settings, **overrides})


def _model(seed: int = 0) -> nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 8))


def _drift(shape: torch.Size) -> torch.Tensor:
    """The direction every honest node's training shares (the same on every node)."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(shape.numel()))


def _step(
    params: dict[str, torch.Tensor], gen: torch.Generator, scale: float = 1e-3, noise: float = 1.0
) -> None:
    """A stand-in for an optimizer step: the shared drift plus this node's own noise."""
    for p in params.values():
        p.add_((_drift(p.shape) + torch.randn(p.shape, generator=gen) * noise) * scale)


def _snapshot(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: p.clone() for n, p in params.items()}


def _sent(packet: DeltaPacket, shapes: dict) -> dict[str, torch.Tensor]:
    return decompress(decode_packet(packet.tensors, shapes), shapes)


def _node(seed: int = 0, **overrides: object) -> tuple[dict[str, torch.Tensor], DeltaExchange]:
    params = model_params(_model(0))  # every node starts from the same weights
    return params, DeltaExchange(_config(**overrides), FAMILY, params)


def test_shares_every_k_steps_from_the_last_share() -> None:
    params, ex = _node()
    gen = torch.Generator().manual_seed(0)
    made = []
    for step in range(1, 7):
        _step(params, gen)
        packet = ex.maybe_make_packet(step, params)
        made.append(packet is not None)
        if packet is not None:
            assert packet.model_family == FAMILY and packet.meta["version"] == str(step)
            assert packet.base_version == step - 2
    assert made == [False, True, False, True, False, True]


def test_a_peer_delta_is_applied_with_the_mixing_weight_and_not_echoed() -> None:
    a_params, a = _node()
    b_params, b = _node(mixing_weight=0.5)
    before = _snapshot(b_params)
    gen = torch.Generator().manual_seed(1)
    _step(a_params, gen)
    _step(a_params, gen)
    packet = a.maybe_make_packet(2, a_params)
    assert packet is not None
    b.receive("a", 2, packet, arrival_round=2)
    stats = b.merge_into(b_params, own_round=2)
    sent = _sent(packet, b.shapes)
    for n in b_params:
        assert torch.allclose(b_params[n], before[n] + 0.5 * sent[n], atol=1e-7)
    assert stats.pending == 1 and stats.aggregate is not None and stats.aggregate.clipped == 0
    assert stats.applied_norm == pytest.approx(0.5 * global_norm(sent), rel=1e-4)
    assert not b.pending
    # b did not train: its next share carries nothing (a's delta is not echoed back)
    echo = b.maybe_make_packet(2, b_params)
    assert echo is not None
    assert global_norm(_sent(echo, b.shapes)) == 0.0


def test_refusals_carry_reasons() -> None:
    a_params, a = _node()
    _, b = _node(max_pending_peers=1)
    _step(a_params, torch.Generator().manual_seed(2))
    good = a.maybe_make_packet(2, a_params)
    assert good is not None

    def reason(sender: str, rnd: int, packet: DeltaPacket, own: int = 10) -> str:
        with pytest.raises(Refused) as info:
            b.receive(sender, rnd, packet, arrival_round=own)
        return info.value.reason

    def with_tensors(data: bytes, encoding: str = good.encoding) -> DeltaPacket:
        return DeltaPacket(FAMILY, 0, encoding, data, {})

    assert (
        reason("x", 10, DeltaPacket("other", 0, good.encoding, good.tensors, {})) == "wrong_family"
    )
    assert reason("x", 10, with_tensors(b"\0" * 64)) == "bad_delta"
    assert reason("x", 10, with_tensors(good.tensors, "dense_fp16")) == "bad_delta"
    other = model_params(nn.Linear(5, 5))
    wrong, _ = compress({n: torch.zeros_like(t) for n, t in other.items()}, None)
    assert reason("x", 10, with_tensors(encode_packet(wrong))) == "wrong_shape"
    dense, _ = compress(
        {n: torch.zeros(s) for n, s in b.shapes.items()}, None, encoding="dense_fp16"
    )
    values = dense.arrays["values"].clone()
    values[0] = float("nan")
    poisoned = encode_packet(replace(dense, arrays={"values": values}))
    assert reason("x", 10, with_tensors(poisoned, "dense_fp16")) == "non_finite"

    b.receive("p", 9, good, arrival_round=10)
    assert reason("p", 8, good) == "stale"  # an older version than the one held from p
    assert reason("q", 9, good) == "pending_full"  # arrived no later than the held one
    b.receive("q", 10, good, arrival_round=11)  # arrived later: evicts p's
    assert set(b.pending) == {"q"}
    b.receive("q", 10, good, arrival_round=11)  # the latest replaces
    assert set(b.pending) == {"q"}


def test_stale_pending_packets_are_dropped_at_merge() -> None:
    a_params, a = _node()
    b_params, b = _node()
    _step(a_params, torch.Generator().manual_seed(3))
    packet = a.maybe_make_packet(2, a_params)
    assert packet is not None
    b.receive("a", 2, packet, arrival_round=2)
    before = _snapshot(b_params)
    stats = b.merge_into(b_params, own_round=7)
    assert stats.stale == 1 and stats.aggregate is None and stats.applied_norm == 0.0
    assert all(torch.equal(before[n], b_params[n]) for n in b_params)


def _share_round(
    nodes: list[tuple[dict, DeltaExchange]],
    gens: list[torch.Generator],
    step: int,
    scales: list[float],
    noise: float = 1.0,
) -> list[DeltaPacket]:
    packets = []
    for (params, ex), gen, scale in zip(nodes, gens, scales, strict=True):
        for _ in range(2):
            _step(params, gen, scale, noise)
        packet = ex.maybe_make_packet(step, params)
        assert packet is not None
        packets.append(packet)
    return packets


def _sign_flipped(packet: DeltaPacket, shapes: dict) -> DeltaPacket:
    """The same packet with every value's sign flipped (each code mirrored)."""
    decoded = decode_packet(packet.tensors, shapes)
    count = make_layout(shapes, decoded.chunk_size, decoded.k).n_selected
    codes = unpack_bits(decoded.arrays["codes"], decoded.bits, count)
    mirrored = pack_bits((1 << decoded.bits) - 1 - codes, decoded.bits)
    flipped = replace(decoded, arrays={**decoded.arrays, "codes": mirrored})
    return DeltaPacket(FAMILY, packet.base_version, "topk", encode_packet(flipped), {})


@pytest.mark.parametrize(("noise", "bound"), [(0.2, 0.3), (3.0, 1.5)])
def test_a_poisoned_minority_is_outvoted_or_bounded(noise: float, bound: float) -> None:
    """5 honest peers, one stepping 1000x, one sending sign-flipped packets.

    noise 0.2: honest training shares a direction, so peers' top-k supports overlap and
    the trimmed mean outvotes the poison (close to the honest mean). noise 3.0: supports
    are nearly disjoint, nothing can be outvoted coordinate by coordinate, and the poison
    is only bounded by norm clipping (same order as one honest update, not 1000x)."""
    honest = [_node() for _ in range(5)]
    hostile = [_node(), _node()]
    victim_params, victim = _node(mixing_weight=1.0, trim_fraction=0.3)
    gens = [torch.Generator().manual_seed(10 + i) for i in range(8)]
    nodes = [*honest, *hostile, (victim_params, victim)]
    scales = [1e-3] * 5 + [1.0, 1e-3] + [1e-3]
    packets = _share_round(nodes, gens, 2, scales, noise)
    packets[6] = _sign_flipped(packets[6], victim.shapes)
    honest_sent = [_sent(p, victim.shapes) for p in packets[:5]]
    honest_mean = {n: torch.stack([s[n] for s in honest_sent]).mean(0) for n in victim.shapes}
    assert global_norm(_sent(packets[5], victim.shapes)) > 100 * global_norm(honest_sent[0])

    before = _snapshot(victim_params)
    for i, packet in enumerate(packets[:7]):
        victim.receive(f"peer{i}", 2, packet, arrival_round=2)
    stats = victim.merge_into(victim_params, own_round=2)
    applied = {n: victim_params[n] - before[n] for n in victim.shapes}
    error = global_norm({n: applied[n] - honest_mean[n] for n in applied}) / global_norm(
        honest_mean
    )
    all_sent = [_sent(p, victim.shapes) for p in packets[:7]]
    undefended = {n: torch.stack([s[n] for s in all_sent]).mean(0) for n in victim.shapes}
    naive = global_norm({n: undefended[n] - honest_mean[n] for n in applied}) / global_norm(
        honest_mean
    )
    print(
        f"noise {noise}: relative distance to the honest mean {error:.3f}, undefended {naive:.0f}"
    )
    assert stats.aggregate is not None and stats.aggregate.clipped >= 1
    assert error < bound
    assert naive > 50


def test_every_peer_poisoned_the_node_keeps_training() -> None:
    hostile = [_node() for _ in range(4)]
    victim_params, victim = _node(mixing_weight=1.0)
    gens = [torch.Generator().manual_seed(20 + i) for i in range(5)]
    for step in (2, 4, 6):
        packets = _share_round([*hostile, (victim_params, victim)], gens, step, [10.0] * 4 + [1e-3])
        own_norm = victim.own_norm
        assert own_norm is not None
        for i, packet in enumerate(packets[:4]):
            victim.receive(f"h{i}", step, packet, arrival_round=step)
        stats = victim.merge_into(victim_params, own_round=step)
        # each merge moves us at most clip_multiple x our own update
        assert stats.applied_norm <= 2.0 * own_norm * (1 + 1e-4)
        assert all(bool(torch.isfinite(p).all()) for p in victim_params.values())


def test_checkpoint_state_round_trip() -> None:
    params, ex = _node()
    gen = torch.Generator().manual_seed(4)
    for step in (1, 2, 3):
        _step(params, gen)
        ex.maybe_make_packet(step, params)
    state = ex.state_tensors()
    assert any(t.abs().sum() > 0 for n, t in state.items() if n.startswith("residual/"))
    restored = DeltaExchange(_config(), FAMILY, params)
    restored.load_state_tensors(state)
    assert restored.last_step == 2 and restored.own_norm == ex.own_norm
    _step(params, gen)
    first, second = ex.maybe_make_packet(4, params), restored.maybe_make_packet(4, params)
    assert first is not None and second is not None and first.tensors == second.tensors
    with pytest.raises(ValueError):
        restored.load_state_tensors({k: v for k, v in state.items() if k != "meta/last_step"})
    bad = dict(state)
    bad["residual/0.bias"] = torch.full((64,), float("nan"))
    with pytest.raises(ValueError):
        restored.load_state_tensors(bad)


def test_rebase_starts_afresh_from_the_given_weights() -> None:
    params, ex = _node()
    gen = torch.Generator().manual_seed(5)
    for _ in range(5):
        _step(params, gen)
    ex.rebase(params, 5)  # e.g. resumed at version 5 from a checkpoint without delta state
    assert ex.maybe_make_packet(6, params) is None
    packet = ex.maybe_make_packet(7, params)
    assert packet is not None and packet.base_version == 5
    assert global_norm(_sent(packet, ex.shapes)) == 0.0  # nothing trained since the rebase


def test_last_shared_is_the_next_shares_baseline_and_read_only() -> None:
    params, ex = _node()
    gen = torch.Generator().manual_seed(6)
    for _ in range(2):
        _step(params, gen)
    assert ex.maybe_make_packet(2, params) is not None
    assert all(torch.equal(ex.last_shared[n], params[n]) for n in params)
    with pytest.raises(TypeError):
        ex.last_shared["0.weight"] = torch.zeros(1)  # type: ignore[index]


def test_error_feedback_carries_each_nodes_learning_to_the_other() -> None:
    """Node a learns only the first half of a target, node b only the second half.
    Sharing 1/16 of each chunk per round (with error feedback) gives both nodes all of it."""
    target = torch.linspace(-1.0, 1.0, 2048)
    half = 1024
    nodes = []
    for _ in range(2):
        params = {"x": torch.zeros(2048)}
        nodes.append((params, DeltaExchange(_config(mixing_weight=1.0), FAMILY, params)))
    alone = torch.zeros(2048)
    for step in range(1, 121):
        for i, (params, _) in enumerate(nodes):
            part = slice(0, half) if i == 0 else slice(half, None)
            params["x"][part] -= 0.1 * (params["x"][part] - target[part])
        alone[:half] -= 0.1 * (alone[:half] - target[:half])
        packets = [ex.maybe_make_packet(step, params) for params, ex in nodes]
        if packets[0] is None:
            continue
        for i, (params, ex) in enumerate(nodes):
            other = packets[1 - i]
            assert other is not None
            ex.receive(f"n{1 - i}", step, other, arrival_round=step)
            ex.merge_into(params, own_round=step)
    for params, _ in nodes:
        err = float((params["x"] - target).abs().max())
        assert err < 0.05, err
    assert float((alone[half:] - target[half:]).abs().max()) > 0.9  # alone, half is unlearned


def test_tiny_model_end_to_end_with_real_optimizer_steps() -> None:
    """Two built-in tiny models (same family) train with Adam on different token batches,
    share at the default settings and merge each other's delta."""
    config = DeltasConfig(enabled=True, every_k_steps=2)
    models = [build_tiny_model("tiny", seed=0) for _ in range(2)]
    family = model_family(models[0])
    assert family == model_family(models[1])
    nodes = []
    for i, model in enumerate(models):
        model.train()
        gen = torch.Generator().manual_seed(100 + i)
        batch = torch.randint(3, 51, (4, 24), generator=gen)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        params = model_params(model)
        nodes.append((model, batch, opt, params, DeltaExchange(config, family, params)))

    def loss_of(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return model(input_ids=batch, labels=batch).loss

    packets = []
    for _ in range(2):
        for model, batch, opt, _, _ in nodes:
            opt.zero_grad()
            loss_of(model, batch).backward()
            opt.step()
    for _, _, _, params, ex in nodes:
        packet = ex.maybe_make_packet(2, params)
        assert packet is not None
        packets.append(packet)
    dense = dense_fp32_bytes(nodes[0][4].shapes)
    ratios = [dense / len(p.tensors) for p in packets]
    print(
        "tiny model share after 2 Adam steps:", [len(p.tensors) for p in packets], "bytes;", ratios
    )
    assert min(ratios) >= 150
    with torch.no_grad():
        loss_before = float(loss_of(models[0], nodes[1][1]))
    for i, (_, _, _, params, ex) in enumerate(nodes):
        ex.receive(f"n{1 - i}", 2, packets[1 - i], arrival_round=2)
        stats = ex.merge_into(params, own_round=2)
        assert stats.aggregate is not None and stats.applied_norm > 0
    with torch.no_grad():
        loss_after = float(loss_of(models[0], nodes[1][1]))
    print(
        "node 0 loss on node 1's batch before/after merging node 1's delta:",
        loss_before,
        loss_after,
    )
    assert all(math.isfinite(float(p.detach().abs().sum())) for p in models[0].parameters())
    assert loss_after < loss_before


def test_config_defaults_and_refusals() -> None:
    default = DeltasConfig()
    assert not default.enabled and default.encoding == "topk" and default.density == 1 / 64
    assert default.bits == 2 and default.chunk_size == 4096 and default.aggregator == "trimmed_mean"
    with pytest.raises(ValueError, match="max_staleness"):
        DeltasConfig(every_k_steps=8, max_staleness=4)
    with pytest.raises(ValueError):
        DeltasConfig.model_validate({"bits": 5})
    with pytest.raises(ValueError):
        DeltasConfig.model_validate({"densty": 0.1})
    on = {"enabled": True}  # a knob of deltas that are off is refused (it does nothing)
    assert DeltasConfig.model_validate({**on, "clip_multiple": None}).clip_multiple is None
    with pytest.raises(ValueError, match="clip_multiple = None does nothing unless enabled"):
        DeltasConfig.model_validate({"clip_multiple": None})
