"""The link model: how a published message reaches other nodes, in virtual time.

`SimNetwork` is a `gossip.memory.MemoryNetwork` whose routing is a `LinkModel`: instead of
handing every message at once to every subscriber, the link model sends it over links
(the topology), each transmission queued on the sender's upload bandwidth, delayed by a
latency drawn per transmission, possibly lost, held back (reordered) or cut by a
partition, and delivered by a scheduler event. On a mesh, receivers relay what they
accepted to their other neighbours, up to a hop limit, GossipSub-style.

Invariants:
- Every random draw comes from the one `random.Random` given at construction, in event
  order, so a seed fixes every latency, loss and reordering of a run.
- A node gets each message at most once (a per-message seen set, like a GossipSub
  router's message cache, deduplicating before the node's gossip layer sees it); later
  copies are counted as `duplicate` and dropped, but their bytes were still sent.
- A node relays a message only if its gossip layer accepted it without counting a drop
  (a refused or duplicate message is not forwarded), and never back to the link it came
  from. On the `full` topology nothing is relayed (everyone is one hop away).
- Offline nodes neither send nor receive; a transmission is not started towards an
  offline node or across an active partition (no connection), and one arriving at a
  node that went offline meanwhile is dropped (`offline`).
- Bytes are counted per sender for every transmission started (lost ones included).
- A message's bookkeeping (its seen set) is freed when its last transmission lands.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from gossip.memory import MemoryNetwork, MemoryTransport
from simnet.clock import Scheduler
from simnet.scenario_network import ConstantLatency, LognormalLatency, NetworkSpec, UniformLatency

Receiver = Callable[[int, str, bytes, str], bool]
"""`receiver(node_index, topic, data, origin_peer_id) -> relay?`: hand a message to a node."""


def mesh_topology(n: int, degree: int, rng: random.Random) -> list[list[int]]:
    """Neighbours of each node: the union of ceil(degree/2) random rings over all nodes.

    Each ring alone connects everyone, so the mesh is connected; each node gets at most
    `degree` (rounded up to even) neighbours, fewer where rings share an edge.
    """
    links: list[set[int]] = [set() for _ in range(n)]
    if n < 2:
        return [[] for _ in range(n)]
    for _ in range(math.ceil(degree / 2)):
        ring = list(range(n))
        rng.shuffle(ring)
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            if a != b:
                links[a].add(b)
                links[b].add(a)
    return [sorted(s) for s in links]


@dataclass(slots=True)
class _Message:
    id: int
    topic: str
    data: bytes
    origin: int
    hop_limit: int
    """0: unlimited."""
    seen: set[int]
    inflight: int = 0
    probe: str | None = None


@dataclass
class Probe:
    """When each node first got one watched message (for dissemination measurements)."""

    origin: int
    published_at: float
    arrivals: list[float] = field(default_factory=list)

    def time_to_reach(self, count: int) -> float | None:
        """Seconds after publication until `count` nodes had it (None: never)."""
        if count <= 0:
            return 0.0
        if len(self.arrivals) < count:
            return None
        return sorted(self.arrivals)[count - 1] - self.published_at


class LinkModel:
    """Links, latency, bandwidth, loss, reordering and partitions between `n` nodes."""

    def __init__(
        self,
        spec: NetworkSpec,
        scheduler: Scheduler,
        rng: random.Random,
        n: int,
        receiver: Receiver,
        peer_ids: list[str],
        limited_topics: frozenset[str] = frozenset(),
    ) -> None:
        self.spec = spec
        self.scheduler = scheduler
        self.rng = rng
        self.n = n
        self.receiver = receiver
        self.peer_ids = peer_ids
        self.limited_topics = limited_topics
        self.mesh = spec.topology == "mesh"
        self.neighbors: list[list[int]] = (
            mesh_topology(n, spec.degree, rng)
            if self.mesh
            else [[j for j in range(n) if j != i] for i in range(n)]
        )
        self.online = [False] * n
        self.bytes_sent = [0] * n
        self.transmissions = 0
        self.counters: Counter[str] = Counter()
        """Transmissions not delivered, by reason, and messages published."""
        self.reach: Counter[str] = Counter()
        """Per topic: sum of nodes reached by its messages (`<topic>`) and messages (`#<topic>`)."""
        self.probes: dict[str, Probe] = {}
        self._uplink_free = [0.0] * n
        self._bytes_per_s = spec.bandwidth_mbps * 1e6 / 8
        self._partitions: dict[int, list[int]] = {}
        self._next_id = 0
        self._watch: str | None = None
        self._latency = self._latency_sampler()

    # ---- configuration during a run --------------------------------------------------

    def set_online(self, index: int, online: bool) -> None:
        self.online[index] = online

    def partition(self, key: int, sides: list[int]) -> None:
        """Start partition `key`: `sides[i]` is node i's side; links across sides are cut."""
        if len(sides) != self.n:
            raise ValueError("a partition needs a side for every node")
        self._partitions[key] = list(sides)

    def heal(self, key: int) -> None:
        self._partitions.pop(key, None)

    def watch_next(self, label: str) -> None:
        """Record, as probe `label`, when each node first gets the next message published."""
        self._watch = label

    def connected(self, index: int) -> list[int]:
        """Online neighbours of `index` not cut off by a partition."""
        return [j for j in self.neighbors[index] if self.online[j] and not self._cut(index, j)]

    # ---- moving messages -------------------------------------------------------------

    def publish(self, origin: int, topic: str, data: bytes) -> int:
        """Send a message `origin` published to its neighbours; return transmissions started."""
        if not self.online[origin]:
            self.counters["sender_offline"] += 1  # a crashed node's last publish
            return 0
        self._next_id += 1
        limit = self.spec.max_hops if (self.mesh and topic in self.limited_topics) else 0
        message = _Message(self._next_id, topic, data, origin, limit, {origin})
        self.counters["published"] += 1
        if self._watch is not None:
            message.probe = self._watch
            self.probes[self._watch] = Probe(origin, self.scheduler.now)
            self._watch = None
        started = 0
        for neighbor in self.neighbors[origin]:
            started += self._send(origin, neighbor, message, 1)
        if message.inflight == 0:
            self._finish(message)
        return started

    def _cut(self, a: int, b: int) -> bool:
        for sides in self._partitions.values():
            if sides[a] != sides[b]:
                return True
        return False

    def _latency_sampler(self) -> Callable[[], float]:
        latency = self.spec.latency
        rng = self.rng
        if isinstance(latency, ConstantLatency):
            seconds = latency.ms / 1000
            return lambda: seconds
        if isinstance(latency, UniformLatency):
            low, high = latency.low_ms / 1000, latency.high_ms / 1000
            return lambda: rng.uniform(low, high)
        if isinstance(latency, LognormalLatency):
            mu, sigma = math.log(latency.median_ms / 1000), latency.sigma
            return lambda: rng.lognormvariate(mu, sigma)
        raise TypeError(f"unknown latency model {latency!r}")

    def _send(self, src: int, dst: int, message: _Message, hops: int) -> int:
        if not self.online[dst]:
            return 0
        if self._partitions and self._cut(src, dst):
            self.counters["partitioned"] += 1
            return 0
        size = len(message.data)
        self.bytes_sent[src] += size
        self.transmissions += 1
        spec = self.spec
        if spec.loss and self.rng.random() < spec.loss:
            self.counters["lost"] += 1
            return 1
        now = self.scheduler.now
        start = now if self._uplink_free[src] < now else self._uplink_free[src]
        done = start + size / self._bytes_per_s
        self._uplink_free[src] = done
        delay = self._latency()
        if spec.reorder and self.rng.random() < spec.reorder:
            delay += spec.reorder_delay_ms / 1000
            self.counters["held_back"] += 1
        message.inflight += 1
        self.scheduler.at(done + delay, self._arrive, src, dst, message, hops)
        return 1

    def _arrive(self, src: int, dst: int, message: _Message, hops: int) -> None:
        message.inflight -= 1
        if not self.online[dst]:
            self.counters["offline"] += 1
        elif dst in message.seen:
            self.counters["duplicate"] += 1
        else:
            message.seen.add(dst)
            if message.probe is not None:
                self.probes[message.probe].arrivals.append(self.scheduler.now)
            relay = self.receiver(dst, message.topic, message.data, self.peer_ids[message.origin])
            if relay and self.mesh and (message.hop_limit == 0 or hops < message.hop_limit):
                for neighbor in self.neighbors[dst]:
                    if neighbor != src:
                        self._send(dst, neighbor, message, hops + 1)
        if message.inflight == 0:
            self._finish(message)

    def _finish(self, message: _Message) -> None:
        self.reach[message.topic] += len(message.seen) - 1
        self.reach["#" + message.topic] += 1
        message.seen = set()

    def summary(self, rounds: int) -> dict[str, object]:
        """JSON-ready link counters; `rounds` normalizes bytes per node per round."""
        total = sum(self.bytes_sent)
        reach = {
            topic: round(self.reach[topic] / self.reach["#" + topic], 3)
            for topic in sorted(self.reach)
            if not topic.startswith("#") and self.reach["#" + topic]
        }
        return {
            "topology": self.spec.topology,
            "mean_degree": round(sum(len(nb) for nb in self.neighbors) / max(self.n, 1), 3),
            "transmissions": self.transmissions,
            "bytes_sent": total,
            "bytes_per_node_round": round(total / max(self.n * rounds, 1), 1),
            "counters": dict(sorted(self.counters.items())),
            "mean_reach": reach,
        }


class SimNetwork(MemoryNetwork):
    """A memory network routed by a `LinkModel` (peer ids map to node indices)."""

    def __init__(self, name: str, link: LinkModel) -> None:
        super().__init__(name)
        self.link = link
        self._index = {peer: i for i, peer in enumerate(link.peer_ids)}

    def route(self, src: MemoryTransport, topic: str, data: bytes) -> int:
        self.published += 1
        started = self.link.publish(self._index[src.peer_id], topic, data)
        self.routed += started
        return started

    def connected_peers(self, transport: MemoryTransport) -> list[str]:
        index = self._index[transport.peer_id]
        return [self.link.peer_ids[j] for j in self.link.connected(index)]
