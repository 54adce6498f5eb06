"""Running a scenario: real `Node`s on a virtual clock over the link model.

Invariants:
- Each node is a real `node.runner.Node` with a real `gossip.layer.Gossip` over a
  `gossip.memory.MemoryTransport` on a `SimNetwork`. simnet replaces only the clock
  (virtual), the routing between transports (the link model) and, in stub mode, the
  learner; it never calls `Node.run` (the production task loop).
- A node's round loop is an asyncio task on the virtual-time loop calling
  `Node.run_round` (so the node's own tasks, such as publishing while it trains, run as
  in production); sampling and training
  take modeled virtual time (`TimedLearner` reports the modeled durations, the offload
  sleeps them), so a node publishes after its sampling time and trains for its training
  time, and the metrics' `time` and `seconds` are virtual and deterministic. Receiving
  is one event per delivered message: transport queue, `Gossip.accept`, `Node.handle`,
  as in the production receive task.
- Determinism: identities, model and task seeds, start times, compute jitter, churn
  choices and every network draw derive from the run seed, and events run in a fixed
  order; the same scenario and seed give byte-identical metrics files.
- Churn: a crash cancels the node's tasks where they are and drops it off the network
  at once (what it had in flight still lands); a
  graceful leave finishes the current round and checkpoints first. A rejoin builds a
  fresh node (new learner, new gossip whose sequence numbers start at the virtual time
  in microseconds, as production starts at wall time) and `Node.resume`s from its newest
  valid checkpoint, redoing any rounds lost since.
- Output: `<run dir>/<node>/metrics.jsonl` holds the node's own metrics records (the
  `on_round` record, one JSON line each, appended across incarnations); `<run
  dir>/run.json` is the run summary. `run_scenario` refuses an existing non-empty run
  dir unless `overwrite` (metrics files are appended to, as a node's are).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import random
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from gossip.layer import Gossip
from gossip.memory import MemoryTransport
from node.learner import ExternalGroup, Learner, LocalGroup, SampleResult, TrainResult
from node.metrics import MetricsWriter
from node.runner import Node, RoundReport
from simnet.clock import Scheduler, VirtualClock, run_now
from simnet.network import LinkModel, SimNetwork
from simnet.scenario import (
    ChurnFault,
    ComputeSpec,
    LeaveFault,
    NodeGroupSpec,
    PartitionFault,
    Scenario,
    VariantSpec,
    load_scenario,
    node_config_data,
)
from simnet.shared import shared_pure_work
from simnet.stub import StubLearner
from swarm.config import NodeConfig, parse_config
from swarm.errors import ConfigError
from swarm.identity import Identity
from swarm.messages import DeltaPacket, Hello, TaskRef
from swarm.transport import deltas_topic, peers_topic, rollouts_topic

YOUNG_GC_THRESHOLD = 50_000
FINAL_FRACTION = 0.1
"""`final_reward` is the mean reward over the last this fraction of rounds."""


@contextmanager
def _fewer_young_gc_passes() -> Iterator[None]:
    """Raise the youngest GC generation's threshold while a run goes (it allocates many
    short-lived objects, almost none in cycles); restored afterwards."""
    old = gc.get_threshold()
    gc.set_threshold(max(old[0], YOUNG_GC_THRESHOLD), old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)


def derive(seed: int, *parts: object) -> int:
    """A 31-bit seed derived from the run seed and a label (stable across platforms)."""
    text = ":".join(str(p) for p in ("simnet", seed, *parts))
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % (2**31)


def derive_bytes(seed: int, *parts: object) -> bytes:
    text = ":".join(str(p) for p in ("simnet-key", seed, *parts))
    return hashlib.blake2b(text.encode(), digest_size=32).digest()


@dataclass(frozen=True)
class Progress:
    """What `run_scenario` reports as it goes."""

    run: str
    """`<variant>/seed-<n>` (or `seed-<n>`)."""
    run_index: int
    runs_total: int
    node_rounds_done: int
    node_rounds_total: int
    virtual_s: float
    finished: bool = False
    summary: dict[str, Any] | None = None
    """The run summary, once `finished`."""


ProgressFn = Callable[[Progress], None]


def _is_wall_time(key: str) -> bool:
    return (
        key in ("seconds", "time")
        or key.startswith("time_")
        or key.endswith(("_s", "_seconds", "_time"))
    )


class TimedLearner:
    """A `Learner` wrapper that reports modeled virtual durations instead of measured ones.

    Sampling takes `sample_s_per_group` per local group; training takes
    `train_s_per_group` per group trained plus `round_overhead_s`; each scaled by a
    jitter factor from the node's own seeded RNG. Measured wall times in the training
    stats (keys named like `seconds`, `time_*`, `*_s`) would break determinism: `seconds`
    becomes the modeled training time, the others None.
    """

    def __init__(self, inner: Learner, compute: ComputeSpec, rng: random.Random) -> None:
        self.inner = inner
        self.compute = compute
        self.rng = rng
        self.model_id = inner.model_id
        self.model_family = inner.model_family

    @property
    def policy_version(self) -> int:
        return self.inner.policy_version

    def _factor(self) -> float:
        jitter = self.compute.jitter
        return self.rng.uniform(1 - jitter, 1 + jitter) if jitter else 1.0

    def sample(self, refs: list[TaskRef], seed: int) -> SampleResult:
        result = self.inner.sample(refs, seed)
        seconds = len(refs) * self.compute.sample_s_per_group * self._factor()
        return SampleResult(result.groups, seconds, 0.0)

    def train(self, local: list[LocalGroup], external: list[ExternalGroup]) -> TrainResult:
        result = self.inner.train(local, external)
        groups = len(local) + len(external)
        seconds = groups * self.compute.train_s_per_group + self.compute.round_overhead_s
        seconds *= self._factor()
        stats = {
            key: (round(seconds, 4) if key == "seconds" else None) if _is_wall_time(key) else v
            for key, v in result.stats.items()
        }
        return TrainResult(stats, seconds)

    def receive_delta(self, sender: str, round: int, packet: DeltaPacket, own_round: int) -> None:
        self.inner.receive_delta(sender, round, packet, own_round)

    def share_deltas(self, own_round: int) -> tuple[DeltaPacket | None, dict[str, Any] | None]:
        return self.inner.share_deltas(own_round)

    def save(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.inner.save(directory, manifest)

    def load(self, directory: Path) -> dict[str, Any]:
        return self.inner.load(directory)


@dataclass
class NodePlan:
    """One node of a run, resolved from the scenario."""

    index: int
    name: str
    group: NodeGroupSpec
    config: NodeConfig
    compute: ComputeSpec
    identity: Identity


@dataclass
class SimNode:
    """A node's life in the simulation, across incarnations (leave and rejoin)."""

    plan: NodePlan
    node: Node | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    writer: MetricsWriter | None = None
    incarnation: int = 0
    online: bool = False
    finished: bool = False
    gone: bool = False
    leaving: bool = False
    rejoin_at: float | None = None
    rewards: dict[int, float | None] = field(default_factory=dict)
    external: dict[int, int] = field(default_factory=dict)
    resumed_from: list[int] = field(default_factory=list)


class Simulation:
    """One run: a scenario (variant) with one seed, written under `run_dir`."""

    def __init__(
        self,
        scenario: Scenario,
        variant: VariantSpec | None,
        seed: int,
        run_dir: Path,
        *,
        progress: Callable[[int, int, float], None] | None = None,
    ) -> None:
        self.scenario = scenario
        self.variant = variant
        self.seed = seed
        self.run_dir = Path(run_dir)
        self._progress = progress
        self.scheduler = Scheduler()
        self.clock = VirtualClock(self.scheduler)
        self.rng = random.Random(derive(seed, "simnet"))
        self.rollouts_topic = rollouts_topic(scenario.name)
        self.peers_topic = peers_topic(scenario.name)
        plans = self._plan()
        self.nodes = [SimNode(plan) for plan in plans]
        self.by_name = {sn.plan.name: sn for sn in self.nodes}
        self.link = LinkModel(
            scenario.network,
            self.scheduler,
            random.Random(derive(seed, "network")),
            len(plans),
            self._receive,
            [plan.identity.peer_id for plan in plans],
            frozenset({self.rollouts_topic}),
        )
        self.network = SimNetwork(f"simnet-{scenario.name}-{seed}", self.link)
        self.events: list[dict[str, Any]] = []
        self.skipped_faults = 0
        self._active = len(self.nodes)
        self._rounds_done = 0
        self._rounds_total = len(self.nodes) * scenario.rounds
        self._pending: list[Callable[[], None]] = []

    # ---- building --------------------------------------------------------------------

    def _plan(self) -> list[NodePlan]:
        scenario, seed = self.scenario, self.seed
        plans = []
        index = 0
        for group in scenario.nodes:
            for name in group.node_names():
                init_key = {"shared": group.name, "family": "family"}.get(group.init, name)
                data = node_config_data(
                    scenario,
                    self.variant,
                    group,
                    name=name,
                    data_dir=self.run_dir / name,
                    model_seed=derive(seed, "model", group.model, init_key),
                    tasks_seed=derive(seed, "tasks", name),
                )
                config = parse_config(data, f"{scenario.name}: node {name}")
                identity = Identity.from_seed(derive_bytes(seed, name))
                compute = group.compute or scenario.compute
                plans.append(NodePlan(index, name, group, config, compute, identity))
                index += 1
        return plans

    def _make_learner(self, plan: NodePlan) -> Learner:
        config = plan.config
        if plan.group.model == "stub":
            return StubLearner(
                config.sampler.group_size,
                config.rewards,
                plan.group.stub.skill,
                plan.group.stub.rate,
            )
        from node.policy_learner import PolicyLearner  # torch: only for real models

        if plan.group.behavior == "poison_deltas":
            from simnet.hostile import PoisonLearner

            learner: PolicyLearner = PoisonLearner(config)
        else:
            learner = PolicyLearner(config)
        warmstart = self.scenario.warmstart
        if warmstart is not None:
            from simnet.base_model import apply_base, base_state

            seed = derive(self.seed, "base", plan.group.model)
            apply_base(learner, base_state(plan.group.model, seed, warmstart))
        return learner

    # ---- lifecycle -------------------------------------------------------------------

    def _join(self, sn: SimNode, *, resume: bool, delay: float) -> None:
        plan = sn.plan
        sn.incarnation += 1
        config = plan.config
        transport = MemoryTransport(config.transport, plan.identity, network=self.network)
        gossip = Gossip(
            transport,
            plan.identity,
            config.node.swarm_id,
            config.gossip,
            self.clock,
            initial_seq=int(self.scheduler.now * 1_000_000),
        )
        rng = random.Random(derive(self.seed, "compute", plan.name, sn.incarnation))
        learner = TimedLearner(self._make_learner(plan), plan.compute, rng)
        node = Node(
            config,
            gossip,
            learner,
            self.clock,
            offload=self._offload,
            on_round=partial(self._on_round, sn),
            timer=self.clock.now,
        )
        if resume:
            directory = node.resume()
            sn.resumed_from.append(node.rounds_done if directory is not None else 0)
        sn.node = node
        run_now(gossip.start())
        run_now(gossip.subscribe(self.rollouts_topic))
        run_now(gossip.subscribe(self.peers_topic))
        if config.deltas.enabled:
            run_now(gossip.subscribe(deltas_topic(config.node.swarm_id, learner.model_family)))
        self.link.set_online(plan.index, True)
        sn.online = True
        sn.writer = MetricsWriter(Path(config.node.data_dir) / "metrics.jsonl")
        sn.tasks = [self.scheduler.spawn(self._life(sn, delay), plan.name)]
        if self.scenario.announce_every_s:
            phase = self.rng.uniform(0, self.scenario.announce_every_s)
            sn.tasks.append(self.scheduler.spawn(self._announce(sn, phase), f"{plan.name}/hello"))

    def _drop_off(self, sn: SimNode) -> None:
        """Off the network now: nothing more reaches it or leaves it."""
        self.link.set_online(sn.plan.index, False)
        sn.online = False

    def _shut_down(self, sn: SimNode) -> None:
        """Stop its transport and close its metrics (its tasks are done or cancelled)."""
        self._close(sn.node, sn.writer)
        sn.writer = None

    @staticmethod
    def _close(node: Node | None, writer: MetricsWriter | None) -> None:
        if node is not None and node.gossip.started:
            run_now(node.gossip.stop())
        if writer is not None:
            writer.close()

    async def _life(self, sn: SimNode, delay: float) -> None:
        node = sn.node
        assert node is not None
        if delay > 0:
            await self.clock.sleep(delay)
        while node.rounds_done < self.scenario.rounds and not sn.leaving:
            await node.run_round()
        if sn.leaving or self.scenario.checkpoint_every:
            await node.checkpoint()
        for task in sn.tasks[1:]:
            task.cancel()
        if sn.leaving:
            sn.leaving = False
            self._event("left", sn, graceful=True, rounds_done=self._rounds_of(sn))
            self._drop_off(sn)
            self._shut_down(sn)
            self._after_leave(sn)
            return
        sn.finished = True
        self._node_done()

    def _node_done(self) -> None:
        self._active -= 1
        if self._active <= 0:
            self.scheduler.finish()

    async def _announce(self, sn: SimNode, phase: float) -> None:
        node = sn.node
        assert node is not None
        await self.clock.sleep(phase)
        while True:
            await node.gossip.publish(self.peers_topic, self._hello(node), node.swarm_round.value)
            await self.clock.sleep(self.scenario.announce_every_s)

    @staticmethod
    def _hello(node: Node) -> Hello:
        learner = node.learner
        return Hello(learner.model_id, learner.model_family, learner.policy_version, ())

    # ---- faults ----------------------------------------------------------------------

    def _event(self, kind: str, sn: SimNode | None = None, **extra: Any) -> None:
        event: dict[str, Any] = {"time": round(self.scheduler.now, 6), "event": kind}
        if sn is not None:
            event["node"] = sn.plan.name
        event.update(extra)
        self.events.append(event)

    @staticmethod
    def _rounds_of(sn: SimNode) -> int:
        return sn.node.rounds_done if sn.node is not None else 0

    def _leave(self, sn: SimNode, graceful: bool, rejoin_at: float | None) -> None:
        if sn.finished or sn.gone or not sn.online or sn.leaving:
            self.skipped_faults += 1
            self._event("leave_skipped", sn)
            return
        sn.rejoin_at = rejoin_at
        if graceful:
            sn.leaving = True
            return
        self._event("crashed", sn, rounds_done=self._rounds_of(sn))
        self._drop_off(sn)
        for task in sn.tasks:
            task.cancel()
        # Its transport stops once its tasks have unwound (a publish it had started may
        # still be running; the link model no longer carries anything from it).
        node, writer = sn.node, sn.writer
        sn.writer = None
        sn.tasks[0].add_done_callback(lambda _: self._close(node, writer))
        self._after_leave(sn)

    def _after_leave(self, sn: SimNode) -> None:
        if sn.rejoin_at is None:
            sn.gone = True
            self._node_done()
            return
        self.scheduler.at(max(sn.rejoin_at, self.scheduler.now), self._rejoin, sn)

    def _rejoin(self, sn: SimNode) -> None:
        self._join(sn, resume=True, delay=0.0)
        self._event("rejoined", sn, resumed_at_round=self._rounds_of(sn))

    def _partition(self, key: int, fault: PartitionFault) -> None:
        index = {sn.plan.name: sn.plan.index for sn in self.nodes}
        sides = [len(fault.groups)] * len(self.nodes)
        for side, items in enumerate(fault.groups):
            for item in items:
                for name in self.scenario.group_members(item):
                    sides[index[name]] = side
        self.link.partition(key, sides)
        self._event("partition", sides=len(fault.groups) + 1)

    def _heal(self, key: int) -> None:
        self.link.heal(key)
        self._event("healed")

    def _schedule_faults(self) -> None:
        at = self.scheduler.at
        for key, fault in enumerate(self.scenario.faults):
            if isinstance(fault, PartitionFault):
                at(fault.start_s, self._partition, key, fault)
                if fault.end_s is not None:
                    at(fault.end_s, self._heal, key)
            elif isinstance(fault, LeaveFault):
                at(
                    fault.at_s,
                    self._leave,
                    self.by_name[fault.node],
                    fault.graceful,
                    fault.rejoin_s,
                )
            elif isinstance(fault, ChurnFault):
                churn_rng = random.Random(derive(self.seed, "churn", key))
                count = max(1, round(fault.fraction * len(self.nodes)))
                for i in sorted(churn_rng.sample(range(len(self.nodes)), count)):
                    when = churn_rng.uniform(fault.start_s, fault.end_s)
                    back = None if fault.down_s is None else when + fault.down_s
                    at(when, self._leave, self.nodes[i], fault.graceful, back)

    def probe(self, node: str, at_s: float, label: str) -> None:
        """At `at_s`, `node` publishes a hello watched as probe `label` (see
        `LinkModel.probes`): when did each node first get it?"""
        sn = self.by_name[node]

        def fire() -> None:
            if sn.node is None or not sn.online:
                return
            self.link.watch_next(label)
            run_now(
                sn.node.gossip.publish(
                    self.peers_topic, self._hello(sn.node), sn.node.swarm_round.value
                )
            )

        self._pending.append(lambda: self.scheduler.at(at_s, fire))

    # ---- the node's two entry points: offload and receive ---------------------------

    async def _offload(self, fn: Callable[..., Any], *args: Any) -> Any:
        result = fn(*args)
        if isinstance(result, SampleResult):
            seconds = result.sample_s + result.score_s
        elif isinstance(result, TrainResult):
            seconds = result.train_s
        else:
            seconds = 0.0
        if seconds > 0:
            await self.clock.sleep(seconds)
        return result

    def _receive(self, index: int, topic: str, data: bytes, source: str) -> bool:
        """Deliver one message to node `index`; True if its gossip accepted it cleanly."""
        sn = self.nodes[index]
        node = sn.node
        if node is None or not sn.online:
            return False
        transport = node.gossip.transport
        if not isinstance(transport, MemoryTransport) or not transport.enqueue(
            topic, data, source=source
        ):
            return False
        message = run_now(transport.receive())
        gossip = node.gossip
        gossip.expire_partials()
        dropped = gossip.counters.dropped.total()
        received = gossip.accept(message)
        if received is not None:
            node.handle(received)
        return gossip.counters.dropped.total() == dropped

    def _on_round(self, sn: SimNode, report: RoundReport) -> None:
        record = report.record
        if sn.writer is not None:
            sn.writer.write(record)
        sn.rewards[report.round] = record.get("mean_local_reward")
        sn.external[report.round] = int(record.get("external_groups", 0))
        self._rounds_done += 1
        if self._progress is not None:
            self._progress(self._rounds_done, self._rounds_total, self.scheduler.now)

    # ---- running ---------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run to the end (every node done or gone); write and return the run summary."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        spread = self.scenario.start_spread_s

        def start() -> None:
            for sn in self.nodes:
                delay = self.rng.uniform(0, spread) if spread else 0.0
                self._join(sn, resume=False, delay=delay)
            self._schedule_faults()
            for schedule in self._pending:
                schedule()
            self._pending = []

        sharing = shared_pure_work() if self.scenario.share_pure_work else nullcontext()
        try:
            with sharing, _fewer_young_gc_passes():
                self.scheduler.run(start)
        finally:
            for sn in self.nodes:
                self._drop_off(sn)
            self.scheduler.close()  # cancels what is left (hellos) and lets it unwind
            for sn in self.nodes:
                self._shut_down(sn)
        summary = self.summary()
        (self.run_dir / "run.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
        return summary

    def summary(self) -> dict[str, Any]:
        rounds = self.scenario.rounds
        nodes = [self._node_summary(sn) for sn in self.nodes]
        cumulative = [n["cumulative_reward"] for n in nodes]
        final = [n["final_reward"] for n in nodes if n["final_reward"] is not None]
        return {
            "scenario": self.scenario.name,
            "variant": self.variant.name if self.variant else None,
            "label": self.variant.display if self.variant else self.scenario.name,
            "seed": self.seed,
            "rounds": rounds,
            "virtual_s": round(self.scheduler.now, 6),
            "events_run": self.scheduler.events_run,
            "cumulative_reward": statistics.fmean(cumulative),
            "final_reward": statistics.fmean(final) if final else None,
            "external_per_round": statistics.fmean(n["external_per_round"] for n in nodes),
            "nodes": nodes,
            "network": self.link.summary(rounds),
            "events": self.events,
            "skipped_faults": self.skipped_faults,
        }

    def _node_summary(self, sn: SimNode) -> dict[str, Any]:
        plan = sn.plan
        rewards = [sn.rewards[r] for r in sorted(sn.rewards)]
        valued = [r for r in rewards if r is not None]
        tail = max(1, round(len(rewards) * FINAL_FRACTION))
        tail_values = [r for r in rewards[-tail:] if r is not None]
        node = sn.node
        drops: Counter[str] = Counter()
        if node is not None:
            drops.update(node.drops)
            drops.update(node.gossip.counters.dropped)
        return {
            "name": plan.name,
            "group": plan.group.name,
            "model": plan.group.model,
            "peer_id": plan.identity.peer_id,
            "local_groups": plan.config.sapo.local_groups,
            "external_groups": plan.config.sapo.external_groups,
            "rounds_done": len(sn.rewards),
            "incarnations": sn.incarnation,
            "resumed_from": sn.resumed_from,
            "gone": sn.gone,
            "cumulative_reward": sum(valued),
            "final_reward": statistics.fmean(tail_values) if tail_values else None,
            "external_used": sum(sn.external.values()),
            "external_per_round": sum(sn.external.values()) / max(len(sn.external), 1),
            "policy_version": node.learner.policy_version if node is not None else 0,
            "swarm_round": node.swarm_round.value if node is not None else 0,
            "drops_last_incarnation": dict(sorted(drops.items())),
        }


# ---- scenarios -------------------------------------------------------------------------


def run_dir_for(out_dir: Path, variant: VariantSpec | None, seed: int) -> Path:
    base = Path(out_dir) / variant.name if variant is not None else Path(out_dir)
    return base / f"seed-{seed}"


def _prepare(run_dir: Path, overwrite: bool) -> None:
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise ConfigError(f"{run_dir}: exists and is not empty (use --force to replace it)")
        shutil.rmtree(run_dir)


def aggregate(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per configuration (variant): mean, std, min and max over seeds of the node-mean
    cumulative reward, with the ratio to the first configuration."""
    order: list[str] = []
    by_label: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run["label"] not in by_label:
            order.append(run["label"])
        by_label.setdefault(run["label"], []).append(run)
    rows = []
    baseline: float | None = None
    for label in order:
        group = by_label[label]
        values = [r["cumulative_reward"] for r in group]
        mean = statistics.fmean(values)
        if baseline is None:
            baseline = mean
        finals = [r["final_reward"] for r in group if r["final_reward"] is not None]
        rows.append(
            {
                "label": label,
                "variant": group[0]["variant"],
                "seeds": len(group),
                "cumulative_mean": mean,
                "cumulative_std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "cumulative_min": min(values),
                "cumulative_max": max(values),
                "vs_first": mean / baseline if baseline else None,
                "final_reward": statistics.fmean(finals) if finals else None,
                "external_per_round": statistics.fmean(r["external_per_round"] for r in group),
            }
        )
    return rows


def run_scenario(
    scenario: Scenario | str | Path,
    out_dir: str | Path,
    progress: ProgressFn | None = None,
    *,
    seeds: list[int] | None = None,
    variants: list[str] | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run every (variant, seed) of a scenario under `out_dir`; return the summary that is
    also written to `<out_dir>/summary.json`.

    Layout: `<out_dir>[/<variant>]/seed-<n>/<node>/metrics.jsonl` and `.../run.json`.
    `seeds` and `variants` (names) restrict what runs.
    """
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    out = Path(out_dir)
    chosen_seeds = list(scenario.seeds if seeds is None else seeds)
    chosen = scenario.variant_list()
    if variants is not None:
        known = {v.name for v in scenario.variants}
        unknown = sorted(set(variants) - known)
        if unknown:
            raise ConfigError(f"unknown variant(s) {unknown}; the scenario has {sorted(known)}")
        chosen = [v for v in chosen if v is not None and v.name in variants]
    if any(g.model != "stub" for g in scenario.nodes):
        import torch  # only real models need it

        torch.set_num_threads(scenario.torch_threads)
    plan = [(v, s) for v in chosen for s in chosen_seeds]
    for variant, seed in plan:
        _prepare(run_dir_for(out, variant, seed), overwrite)
    runs = []
    for number, (variant, seed) in enumerate(plan):
        run_dir = run_dir_for(out, variant, seed)
        label = str(run_dir.relative_to(out))

        def report(done: int, total: int, now: float, label: str = label, i: int = number) -> None:
            if progress is not None:
                progress(Progress(label, i, len(plan), done, total, now))

        started = time.perf_counter()
        summary = Simulation(scenario, variant, seed, run_dir, progress=report).run()
        wall = time.perf_counter() - started
        runs.append(
            {
                "dir": label,
                "variant": summary["variant"],
                "label": summary["label"],
                "seed": seed,
                "cumulative_reward": summary["cumulative_reward"],
                "final_reward": summary["final_reward"],
                "external_per_round": summary["external_per_round"],
                "wall_s": round(wall, 3),
            }
        )
        if progress is not None:
            total = len(summary["nodes"]) * scenario.rounds
            progress(
                Progress(
                    label, number, len(plan), total, total, summary["virtual_s"], True, summary
                )
            )
    result = {
        "scenario": scenario.name,
        "description": scenario.description,
        "rounds": scenario.rounds,
        "runs": runs,
        "configurations": aggregate(runs),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result, indent=1, sort_keys=True))
    return result
