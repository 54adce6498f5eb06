"""CHOCO gossip math (`policy.choco`): stream classification, the clipped consensus
direction, and convergence on a toy problem with the real top-k codec."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from policy.choco import (
    StreamPosition,
    add_into,
    classify,
    consensus_direction,
    consensus_distance,
    difference,
    step_into,
)
from policy.compression import compress, decompress

D = 2048


# ---- streams --------------------------------------------------------------------------


def test_classify_applies_in_sequence_and_detects_gaps() -> None:
    held = StreamPosition("s", 4, True)
    assert classify(held, "s", 5, "diff") == "apply"
    assert classify(held, "s", 6, "diff") == "gap"
    assert classify(held, "s", 4, "diff") == "old"
    assert classify(held, "s", 2, "diff") == "old"
    assert classify(held, "s", 3, "key") == "old"
    assert classify(held, "s", 5, "key") == "resync"
    assert classify(held, "t", 1, "key") == "resync"  # a new stream: the peer restarted
    assert classify(held, "t", 2, "diff") == "wait"  # a new stream's diff, no keyframe yet
    assert classify(None, "s", 5, "diff") == "wait"
    assert classify(None, "s", 1, "key") == "resync"


def test_classify_waits_for_a_keyframe_after_a_gap() -> None:
    broken = StreamPosition("s", 6, False)
    assert classify(broken, "s", 7, "diff") == "wait"
    assert classify(broken, "s", 8, "key") == "resync"
    assert classify(broken, "s", 6, "key") == "old"


def test_add_into_reports_a_non_finite_estimate() -> None:
    est = {"w": torch.zeros(4)}
    assert add_into(est, {"w": torch.ones(4)})
    assert torch.equal(est["w"], torch.ones(4))
    assert add_into(est, {"w": torch.tensor([3e38, 0.0, 0.0, 0.0])})  # still finite
    assert not add_into(est, {"w": torch.tensor([3e38, 0.0, 0.0, 0.0])})  # overflowed


# ---- the consensus direction ----------------------------------------------------------


def test_direction_is_the_uniform_average_of_gaps() -> None:
    own = {"w": torch.zeros(3)}
    peers = [{"w": torch.tensor([3.0, 0.0, 0.0])}, {"w": torch.tensor([0.0, 3.0, 0.0])}]
    direction, stats = consensus_direction(own, peers, clip_multiple=None)
    assert torch.allclose(direction["w"], torch.tensor([1.0, 1.0, 0.0]))  # w = 1/3
    assert stats.peers == 2 and stats.clipped == 0 and stats.clip_bound is None
    assert stats.median_gap == pytest.approx(3.0)
    assert own["w"].abs().sum() == 0  # inputs untouched


def test_a_far_peer_is_clipped_to_a_multiple_of_the_median_gap() -> None:
    own = {"w": torch.zeros(2)}
    peers = [
        {"w": torch.tensor([1.0, 0.0])},
        {"w": torch.tensor([0.0, 1.0])},
        {"w": torch.tensor([1e6, 0.0])},
    ]
    direction, stats = consensus_direction(own, peers, clip_multiple=2.0)
    assert stats.clipped == 1 and stats.clip_bound == pytest.approx(2.0)
    # the hostile term is scaled to norm 2, then weighted 1/4 like every other
    assert torch.allclose(direction["w"], torch.tensor([(1.0 + 2.0) / 4, 1.0 / 4]), atol=1e-5)
    with pytest.raises(ValueError, match="NaN or Inf"):
        consensus_direction(own, [{"w": torch.tensor([math.inf, 0.0])}], 2.0)


def test_no_peers_means_no_move() -> None:
    params = {"w": torch.ones(3)}
    direction, stats = consensus_direction({"w": torch.zeros(3)}, [], 2.0)
    assert stats.peers == 0
    assert step_into(params, direction, 0.5) == 0.0
    assert torch.equal(params["w"], torch.ones(3))


def test_step_into_and_difference() -> None:
    params = {"w": torch.zeros(2, dtype=torch.float64)}
    moved = step_into(params, {"w": torch.tensor([3.0, 4.0])}, 0.5)
    assert moved == pytest.approx(2.5)
    assert difference(params, {"w": torch.ones(2)})["w"].tolist() == [0.5, 1.0]
    with pytest.raises(ValueError, match="gamma"):
        step_into(params, {"w": torch.zeros(2)}, 0.0)


def test_consensus_distance() -> None:
    a, b = {"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([-1.0, 0.0])}
    assert consensus_distance([a, b]) == pytest.approx(1.0)
    assert consensus_distance([a, a]) == 0.0


# ---- the toy problem --------------------------------------------------------------------


def _toy(
    *,
    rounds: int,
    gamma: float = 0.1,
    lr: float = 0.0,
    communicate: bool = True,
    topology: str = "full",
    hostile: int | None = None,
    clip: float | None = 2.0,
    n: int = 8,
) -> list[float]:
    """n nodes, f_i(x) = ||x - b_i||^2 / 2 (different optima), one gradient step of size
    `lr` then one CHOCO share per round: q = topk-1/16-4bit(x_i - xhat_i) through the real
    codec. With lr = 0 the nodes start at their optima (pure gossip averaging). A hostile
    node publishes 1000x its true q (its peers' copy of it runs away). Returns the honest
    nodes' consensus distance after each round."""
    b = torch.randn(n, D, generator=torch.Generator().manual_seed(0))
    x = b.clone() if lr == 0 else torch.zeros(n, D)
    own_copy = torch.zeros(n, D)  # xhat_i as node i holds it
    public = torch.zeros(n, D)  # xhat_i as its peers hold it (differs only for the hostile)
    honest = [i for i in range(n) if i != hostile]
    out = []
    for _ in range(rounds):
        x -= lr * (x - b)
        for i in range(n):
            delta = difference({"w": x[i]}, {"w": own_copy[i]})
            packet, _ = compress(delta, None, density=1 / 16, bits=4, chunk_size=256)
            q = decompress(packet, {"w": (D,)})["w"]
            add_into({"w": own_copy[i]}, {"w": q})
            add_into({"w": public[i]}, {"w": q * (1000.0 if i == hostile else 1.0)})
        if communicate:
            moves = []
            for i in honest:
                if topology == "full":
                    peers = [j for j in range(n) if j != i]
                else:
                    peers = [(i - 1) % n, (i + 1) % n]
                direction, _ = consensus_direction(
                    {"w": own_copy[i]}, [{"w": public[j]} for j in peers], clip
                )
                moves.append((i, direction["w"]))
            for i, move in moves:
                step_into({"w": x[i]}, {"w": move}, gamma)
        out.append(consensus_distance([{"w": x[i]} for i in honest]))
    return out


@pytest.mark.parametrize(
    ("topology", "gamma", "rounds", "target"),
    [
        ("full", 0.1, 150, 0.05),
        ("ring", 0.1, 200, 1.0),
    ],
)
def test_choco_gossip_contracts_geometrically(
    one_thread: None, topology: str, gamma: float, rounds: int, target: float
) -> None:
    """Pure averaging (lr 0): the spread falls geometrically (each 25-round window
    shrinks it by a factor of at least 1.5 once the estimates caught up), while without
    communication it does not move at all."""
    choco = _toy(rounds=rounds, gamma=gamma, topology=topology)
    alone = _toy(rounds=rounds, communicate=False)
    start = choco[0]
    assert alone[-1] == pytest.approx(alone[0])
    assert choco[-1] < target, choco[-1]
    assert choco[-1] < start / 40
    windows = [choco[i] for i in range(50, rounds, 25)]
    ratios = [a / b for a, b in itertools.pairwise(windows)]
    assert min(ratios) > 1.5, ratios


@pytest.mark.slow
def test_choco_sgd_keeps_nodes_close_where_silos_drift(one_thread: None) -> None:
    """With gradient steps toward different optima the spread cannot reach 0 (CHOCO-SGD
    converges to a neighbourhood of consensus whose size scales with the step size), but
    it stays far below the silos'."""
    choco = _toy(rounds=150, lr=0.02)
    alone = _toy(rounds=150, lr=0.02, communicate=False)
    assert alone[-1] > 35
    assert choco[-1] < 0.25 * alone[-1], (choco[-1], alone[-1])
    assert max(choco[75:]) < 1.05 * min(choco[75:])  # settled, not drifting
    larger_steps = _toy(rounds=150, lr=0.05)
    assert larger_steps[-1] > 1.5 * choco[-1]


def test_too_large_a_step_diverges(one_thread: None) -> None:
    """The contraction needs a small gamma for 1/16 top-k (the paper's condition): at
    0.5 the spread grows. The docs' default gamma is chosen from this."""
    assert _toy(rounds=150, gamma=0.5)[-1] > _toy(rounds=150, gamma=0.5)[0]


@pytest.mark.slow
def test_a_hostile_node_is_clipped(one_thread: None) -> None:
    """A node publishing 1000x its q: honest nodes stay finite and near their optima's
    range and still contract; without clipping the same node blows them up."""
    clipped = _toy(rounds=120, hostile=3)
    assert all(math.isfinite(v) for v in clipped)
    assert clipped[-1] < 0.01 * clipped[0]
    with_sgd = _toy(rounds=150, lr=0.02, hostile=3)
    alone = _toy(rounds=150, lr=0.02, communicate=False, hostile=3)
    assert with_sgd[-1] < 0.25 * alone[-1], (with_sgd[-1], alone[-1])
    unclipped = _toy(rounds=120, hostile=3, clip=None)
    assert unclipped[-1] > 2 * clipped[0], unclipped[-1]
