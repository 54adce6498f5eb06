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
  is one event per delivered message: transport (`deliver_now`), `Gossip.accept`,
  `Node.take` (the intake's handle and admit, as in the production receive and admit tasks).
- Determinism: identities, model and task seeds, start times, compute jitter, churn
  choices and every network draw derive from the run seed, and events run in a fixed
  order; the same scenario and seed give byte-identical metrics files.
- Churn: a crash cancels the node's tasks where they are and drops it off the network
  at once (what it had in flight still lands); a
  graceful leave finishes the current round and checkpoints first. A rejoin builds a
  fresh node (new learner, new gossip whose sequence numbers start at the virtual time
  in microseconds, as production starts at wall time) and `Node.resume`s from its newest
  valid checkpoint, redoing any rounds lost since.
- Wire attackers (`simnet.attackers`, groups with an attack `behavior`) take network
  slots like nodes but run no `Node`: they act on a timer, see what is delivered to
  them (never relaying it), and are listed under `attackers` in the run summary, apart
  from `nodes`, whose figures are the learning nodes' only.
- Output: `<run dir>/<node>/metrics.jsonl` holds the node's own metrics records (the
  `on_round` record, one JSON line each, appended across incarnations); `<run
  dir>/run.json` is the run summary (byte-identical for a scenario and seed);
  `<run dir>/cost.json` what the run cost this machine (wall seconds, CPU seconds of
  this process's threads and of the worker processes it waited for: not reproducible,
  so apart). `run_scenario` refuses an existing non-empty run dir unless `overwrite`
  (metrics files are appended to, as a node's are).
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from gossip.layer import Gossip
from gossip.memory import MemoryTransport
from node.learner import SampleResult, TrainResult
from node.metrics import MetricsWriter
from node.runner import Node, RoundReport
from simnet.attackers import Attacker, AttackSettings
from simnet.clock import Scheduler, VirtualClock, run_now
from simnet.network import LinkModel, SimNetwork
from simnet.run_summary import RunCost, attacker_summary, node_summary
from simnet.scenario import MANY_KEYS, Scenario, VariantSpec
from simnet.scenario_network import ChurnFault, LeaveFault, PartitionFault
from simnet.shared import shared_pure_work
from simnet.sim_nodes import (
    NodePlan,
    SimNode,
    TimedLearner,
    derive,
    derive_bytes,
    fewer_young_gc_passes,
    make_learner,
    node_config,
    sim_network,
)
from swarm.identity import Identity
from swarm.messages import Hello
from swarm.transport import deltas_topic, peers_topic, rollouts_topic


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
        for plan in plans:  # each simulated node on an address block of its own
            self.network.locate(plan.identity.peer_id, sim_network(plan.index))
        self.events: list[dict[str, Any]] = []
        self.skipped_faults = 0
        learners = [sn for sn in self.nodes if not sn.plan.group.is_attacker]
        self._active = len(learners)
        self._rounds_done = 0
        self._rounds_total = sum(self._rounds_for(sn) for sn in learners)
        self._pending: list[Callable[[], None]] = []

    # ---- building --------------------------------------------------------------------

    def _plan(self) -> list[NodePlan]:
        scenario, seed = self.scenario, self.seed
        plans = []
        index = 0
        for group in scenario.nodes:
            for name in group.node_names():
                config = node_config(scenario, self.variant, group, name, seed, self.run_dir / name)
                identity = Identity.from_seed(derive_bytes(seed, name))
                compute = group.compute or scenario.compute
                plans.append(NodePlan(index, name, group, config, compute, identity))
                index += 1
        return plans

    # ---- lifecycle -------------------------------------------------------------------

    def _join_attacker(self, sn: SimNode, delay: float) -> None:
        plan = sn.plan
        spec = plan.group.hostile
        extra = [
            Identity.from_seed(derive_bytes(self.seed, plan.name, "sybil", i))
            for i in range(1, spec.sybil_keys if plan.group.behavior in MANY_KEYS else 1)
        ]
        for i, identity in enumerate(extra, start=1):
            self.network.locate(identity.peer_id, sim_network(plan.index, i % spec.sybil_networks))
        sn.attacker = Attacker(
            AttackSettings.of(plan.group.behavior, spec),
            plan.config,
            [plan.identity, *extra],
            partial(self.link.publish, plan.index),
            random.Random(derive(self.seed, "attacker", plan.name)),
            derive(self.seed, "attacker-tasks", plan.name),
            int(self.scheduler.now * 1_000_000),
        )
        self.link.set_online(plan.index, True)
        sn.online = True
        sn.tasks = [self.scheduler.spawn(self._attack(sn, delay), plan.name)]

    async def _attack(self, sn: SimNode, delay: float) -> None:
        attacker = sn.attacker
        assert attacker is not None
        await self.clock.sleep(delay + self.rng.uniform(0, attacker.settings.every_s))
        while True:
            attacker.tick()
            await self.clock.sleep(attacker.settings.every_s)

    def _join(self, sn: SimNode, *, resume: bool, delay: float) -> None:
        plan = sn.plan
        if plan.group.is_attacker:
            self._join_attacker(sn, delay)
            return
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
        learner = TimedLearner(
            make_learner(plan, self.scenario.warmstart, self.seed), plan.compute, rng
        )
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

    def _late_join(self, sn: SimNode, delay: float) -> None:
        self._event("joined", sn)
        self._join(sn, resume=False, delay=delay)

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
        # As `Node.run` does: the last round samples nothing ahead for a round never run
        # (a real model's prefetch after round 13 of 13 cost a twelfth of a pilot's
        # sampling).
        node.last_round = self._rounds_for(sn)
        while node.rounds_done < self._rounds_for(sn) and not sn.leaving:
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

    def _rounds_for(self, sn: SimNode) -> int:
        group_rounds = sn.plan.group.rounds
        return self.scenario.rounds if group_rounds is None else group_rounds

    def _node_done(self) -> None:
        self._active -= 1
        if self._active <= 0:
            self.scheduler.finish()

    async def _announce(self, sn: SimNode, phase: float) -> None:
        node = sn.node
        assert node is not None
        await self.clock.sleep(phase)
        while True:
            await node.gossip.publish(
                self.peers_topic, self._hello(node), node.learner.policy_version
            )
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
        if sn.finished or sn.gone or not sn.online or sn.leaving or sn.attacker is not None:
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
                    self.peers_topic, self._hello(sn.node), sn.node.learner.policy_version
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
        if sn.attacker is not None:
            if sn.online:
                sn.attacker.observe(topic, data)
            return False  # attackers relay nothing
        node = sn.node
        if node is None or not sn.online:
            return False
        transport = node.gossip.transport
        if not isinstance(transport, MemoryTransport):
            return False
        message = transport.deliver_now(topic, data, source=source)  # enqueue + receive
        if message is None:
            return False
        gossip = node.gossip
        gossip.expire_partials()
        before = sum(gossip.counters.dropped.values())  # Counter.total(), one call less
        received = gossip.accept(message)
        if received is not None:
            run_now(node.take(received))
        return sum(gossip.counters.dropped.values()) == before

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
        cost = RunCost.start()
        spread = self.scenario.start_spread_s

        def start() -> None:
            for sn in self.nodes:
                delay = self.rng.uniform(0, spread) if spread else 0.0
                join_s = sn.plan.group.join_s
                if join_s > 0:
                    self.scheduler.at(join_s, self._late_join, sn, delay)
                else:
                    self._join(sn, resume=False, delay=delay)
            self._schedule_faults()
            for schedule in self._pending:
                schedule()
            self._pending = []

        sharing = shared_pure_work() if self.scenario.share_pure_work else nullcontext()
        try:
            with sharing, fewer_young_gc_passes():
                self.scheduler.run(start)
        finally:
            for sn in self.nodes:
                self._drop_off(sn)
            self.scheduler.close()  # cancels what is left (hellos) and lets it unwind
            for sn in self.nodes:
                self._shut_down(sn)
        summary = self.summary()
        (self.run_dir / "run.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
        (self.run_dir / "cost.json").write_text(json.dumps(cost.so_far(), indent=1))
        return summary

    def summary(self) -> dict[str, Any]:
        rounds = self.scenario.rounds
        nodes = [node_summary(sn) for sn in self.nodes if sn.attacker is None]
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
            "attackers": [attacker_summary(sn) for sn in self.nodes if sn.attacker is not None],
            "network": self.link.summary(rounds),
            "events": self.events,
            "skipped_faults": self.skipped_faults,
        }
