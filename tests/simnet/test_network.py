"""The link model on its own: topology, bandwidth queueing, partitions, relaying, probes."""

from __future__ import annotations

import random
from collections import deque

import pytest

from simnet.clock import Scheduler
from simnet.network import LinkModel, mesh_topology
from simnet.scenario_network import NetworkSpec


def _connected(neighbors: list[list[int]]) -> bool:
    seen, todo = {0}, deque([0])
    while todo:
        for j in neighbors[todo.popleft()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == len(neighbors)


@pytest.mark.parametrize(("n", "degree"), [(2, 6), (7, 6), (50, 4), (300, 6)])
def test_mesh_is_connected_symmetric_and_bounded(n: int, degree: int) -> None:
    neighbors = mesh_topology(n, degree, random.Random(n))
    assert _connected(neighbors)
    for i, links in enumerate(neighbors):
        assert i not in links and len(links) <= degree
        assert all(i in neighbors[j] for j in links)
    assert mesh_topology(n, degree, random.Random(n)) == neighbors


class _Sink:
    """A receiver recording (time, node, data) and relaying everything."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.got: list[tuple[float, int, bytes]] = []

    def __call__(self, index: int, topic: str, data: bytes, origin: str) -> bool:
        self.got.append((self.scheduler.now, index, data))
        return True


def _link(n: int, **spec: object) -> tuple[Scheduler, LinkModel, _Sink]:
    scheduler = Scheduler()
    sink = _Sink(scheduler)
    link = LinkModel(
        NetworkSpec.model_validate(spec),
        scheduler,
        random.Random(0),
        n,
        sink,
        [f"p{i}" for i in range(n)],
        frozenset({"limited"}),
    )
    for i in range(n):
        link.set_online(i, True)
    return scheduler, link, sink


def test_uplink_bandwidth_queues_a_senders_transmissions() -> None:
    # 1 Mbit/s = 125,000 bytes/s: a 12,500-byte message takes 0.1 s to send.
    scheduler, link, sink = _link(3, bandwidth_mbps=1.0, latency={"type": "constant", "ms": 10})
    link.publish(0, "t", b"x" * 12_500)
    scheduler.run(lambda: None, until=scheduler.now + 1000.0)
    assert [(round(t, 6), i) for t, i, _ in sink.got] == [(0.11, 1), (0.21, 2)]


def test_partition_cuts_links_until_it_heals() -> None:
    scheduler, link, sink = _link(4)
    link.partition(1, [0, 0, 1, 1])
    link.publish(0, "t", b"a")
    scheduler.run(lambda: None, until=scheduler.now + 1000.0)
    assert sorted(i for _, i, _ in sink.got) == [1]
    assert link.counters["partitioned"] == 2
    assert link.connected(0) == [1]
    link.heal(1)
    link.publish(0, "t", b"b")
    scheduler.run(lambda: None, until=scheduler.now + 1000.0)
    assert sorted(i for _, i, d in sink.got if d == b"b") == [1, 2, 3]


def test_mesh_relay_delivers_once_per_node_and_respects_the_hop_limit() -> None:
    scheduler, link, sink = _link(60, topology="mesh", degree=4, max_hops=1)
    link.publish(0, "free", b"flood")
    link.publish(0, "limited", b"near")
    scheduler.run(lambda: None, until=scheduler.now + 1000.0)
    flood = [i for _, i, d in sink.got if d == b"flood"]
    near = [i for _, i, d in sink.got if d == b"near"]
    assert sorted(flood) == list(range(1, 60))  # everyone but the origin, exactly once
    assert sorted(near) == link.neighbors[0]
    assert link.counters["duplicate"] > 0
    assert link.reach["free"] == 59 and link.reach["limited"] == len(link.neighbors[0])


def test_offline_nodes_neither_get_nor_relay_and_loss_is_counted() -> None:
    scheduler, link, sink = _link(5, loss=0.5)
    link.set_online(3, False)
    for k in range(40):
        link.publish(k % 2, "t", bytes([k]))
    scheduler.run(lambda: None, until=scheduler.now + 1000.0)
    assert all(i != 3 for _, i, _ in sink.got)
    assert 0 < link.counters["lost"] < 40 * 3
    assert len(sink.got) + link.counters["lost"] == 40 * 3


def test_probe_records_first_arrivals() -> None:
    scheduler, link, _ = _link(
        10, topology="mesh", degree=4, latency={"type": "constant", "ms": 100}
    )
    link.watch_next("p")
    link.publish(0, "t", b"probe")
    scheduler.run(lambda: None, until=scheduler.now + 1000.0)
    probe = link.probes["p"]
    assert len(probe.arrivals) == 9
    hops_to_all = probe.time_to_reach(9)
    assert hops_to_all is not None and 0.1 <= hops_to_all <= 0.5
    assert probe.time_to_reach(10) is None and probe.time_to_reach(0) == 0.0
