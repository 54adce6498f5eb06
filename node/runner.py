"""The node: the SAPO round loop plus gossip, as named tasks that fail fast together.

Invariants:
- Three tasks: `rounds` (sample, publish, select, train, checkpoint, metrics), `receive`
  (verify-free here: gossip already authenticated; this task applies the round clock,
  re-scores groups and fills the pool) and `announce` (hello on the peers topic).
  A dead task stops the node with its error.
- Sampling and training run through `offload` (a thread in production), so gossip keeps
  flowing while the model works.
- The swarm round moves only on accepted messages and local steps (swarm.clock).
- Everything used from peers is within `max_staleness` of our round at selection time.
- Every refusal that is the peer's fault is reported to gossip's peer scores
  (`Gossip.penalize`), and every group admitted to the pool earns its sender a little
  credit; a peer the scores ignore no longer reaches `handle` at all.
- Catching up (`SwarmRound.note_future`) listens only to peers first heard at least
  `sapo.catch_up_min_rounds` of our rounds ago and in good standing, so a burst of fresh
  keys (sybils) cannot move the clock; a patient attacker holding `catch_up_quorum` keys
  in good standing for that long still can (the limit of counting keys).
- A node with J = 0, or alone, runs the same loop on local groups only.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossip.layer import Gossip, Received
from node import checkpoints
from node.learner import ExternalGroup, Learner
from node.metrics import MetricsWriter, histogram
from node.pool import RolloutPool
from node.rescore import Refused, rescore_group
from node.supervise import supervise
from rewards.mixture import TaskStream
from swarm.clock import Clock, SwarmRound
from swarm.config import NodeConfig
from swarm.messages import DeltaPacket, Hello, RolloutBatch
from swarm.transport import deltas_topic, peers_topic, rollouts_topic

log = logging.getLogger("swarm.node")

Offload = Callable[..., Awaitable[Any]]
ANNOUNCE_EVERY_S = 5.0
MAX_PEERS_TRACKED = 4096
NOT_THE_PEERS_FAULT = frozenset(
    {"zero_variance", "stale", "pending_full", "deltas_disabled", "from_future", "foreign_task"}
)
CREDIT_PER_GROUP = 0.5
"""Score credit for a peer's group that passed re-scoring and entered the pool."""


@dataclass
class PeerInfo:
    model_id: str
    model_family: str
    policy_version: int
    round: int
    last_seen: float


@dataclass
class RoundReport:
    """What the CLI shows after each round (a subset of the metrics line)."""

    round: int
    record: dict[str, Any] = field(default_factory=dict)


class Node:
    def __init__(
        self,
        config: NodeConfig,
        gossip: Gossip,
        learner: Learner,
        clock: Clock,
        *,
        offload: Offload = asyncio.to_thread,
        on_round: Callable[[RoundReport], None] | None = None,
        capabilities: tuple[str, ...] = (),
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.gossip = gossip
        self.learner = learner
        self.clock = clock
        self.offload = offload
        self.on_round = on_round
        self.capabilities = capabilities
        self.timer = timer
        self.data_dir = Path(config.node.data_dir)
        sapo = config.sapo
        self.swarm_round = SwarmRound(0, sapo.max_ahead, sapo.catch_up_quorum)
        self.pool = RolloutPool(
            max_groups=sapo.pool_max_groups,
            max_bytes=sapo.pool_max_bytes,
            max_staleness=sapo.max_staleness,
            per_sender_cap=sapo.per_sender_cap,
            seed=config.tasks.seed,
        )
        self.tasks = TaskStream(config.tasks, config.model.seed)
        self._own_sources: frozenset[str] | None = (
            None
            if config.tasks.accept_foreign
            else frozenset(spec.source for spec in config.tasks.mixture)
        )
        self.rounds_done = 0
        self.drops: Counter[str] = Counter()
        self.peer_faults: Counter[str] = Counter()
        self.peers: dict[str, PeerInfo] = {}
        self._first_heard: dict[str, int] = {}
        """Our `rounds_done` when each peer's first authenticated message arrived."""
        self.stop_requested = asyncio.Event()
        self._rollouts_topic = rollouts_topic(config.node.swarm_id)
        self._peers_topic = peers_topic(config.node.swarm_id)
        self._deltas_topic = (
            deltas_topic(config.node.swarm_id, learner.model_family)
            if config.deltas.enabled
            else None
        )
        self._metrics: MetricsWriter | None = None
        self._wait_s = 0.0
        self.checkpoint_errors = 0  # failed checkpoint writes (disk full, I/O error, ...)
        self.last_checkpoint_error: str | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def resume(self) -> Path | None:
        """Load the newest checkpoint that loads cleanly, if any; return its directory."""
        for directory in checkpoints.valid_newest_first(self.data_dir):
            state = checkpoints.read_node_state(directory)
            assert state is not None
            try:
                self.learner.load(directory)
            except (ValueError, OSError) as exc:  # torn or foreign learner files
                log.warning("skipping checkpoint %s: %s", directory, exc)
                continue
            self.rounds_done = int(state["rounds_done"])
            self.swarm_round.value = int(state["swarm_round"])
            self.tasks.load_state_dict(state["tasks"])
            self.pool.load_state_dict(state["pool"])
            log.info("resumed from %s (round %d)", directory, self.rounds_done)
            return directory
        return None

    def _node_state(self) -> dict[str, Any]:
        return {
            "rounds_done": self.rounds_done,
            "swarm_round": self.swarm_round.value,
            "tasks": self.tasks.state_dict(),
            "pool": self.pool.state_dict(),
            "peer_id": self.gossip.identity.peer_id,
            "model_id": self.learner.model_id,
            "model_family": self.learner.model_family,
        }

    async def checkpoint(self) -> Path | None:
        """Write a checkpoint of the current round (off the event loop), keep the newest.

        A write failing with `OSError` (disk full, quota, file too large, I/O error) does
        not stop the node: it is logged with the path and errno, counted in
        `checkpoint_errors` / `last_checkpoint_error`, what it left is deleted, the newest
        valid checkpoint is kept (older ones are deleted if the disk is full, to make room)
        and the next interval tries again. Returns the directory, or None if it failed.
        """
        directory = checkpoints.checkpoint_dir(self.data_dir, self.rounds_done)
        if not checkpoints.is_valid(directory):
            state = self._node_state()
            try:
                checkpoints.remove_torn(directory)  # a crash before node.json left it
                await self.offload(self.learner.save, directory, {"rounds_done": self.rounds_done})
                checkpoints.write_node_state(directory, state)
            except OSError as exc:
                self.checkpoint_errors += 1
                reason = checkpoints.describe(exc)
                self.last_checkpoint_error = f"round {self.rounds_done}: {reason}"
                kept = checkpoints.discard_failed(self.data_dir, directory, exc)
                log.error(
                    "checkpoint %s failed (%s); kept for a restart: %s; training goes on, "
                    "next try in %d round(s)",
                    directory,
                    reason,
                    kept or "nothing (no valid checkpoint)",
                    self.config.node.checkpoint_every,
                )
                return None
        checkpoints.prune(self.data_dir)
        return directory

    def request_stop(self) -> None:
        self.stop_requested.set()

    @property
    def peer_id(self) -> str:
        return self.gossip.identity.peer_id

    def listen_addrs(self) -> list[str]:
        """Full multiaddrs peers can bootstrap from (empty for transports without any)."""
        listen = getattr(self.gossip.transport, "listen_addrs", None)
        return list(listen()) if callable(listen) else []

    async def run(self, rounds: int | None, on_started: Callable[[], None] | None = None) -> int:
        """Run until `rounds` more rounds are done (None: until stopped). Returns rounds done."""
        await self.gossip.start()
        await self.gossip.subscribe(self._rollouts_topic)
        await self.gossip.subscribe(self._peers_topic)
        if self._deltas_topic is not None:
            await self.gossip.subscribe(self._deltas_topic)
        if on_started is not None:
            on_started()
        self._metrics = MetricsWriter(self.data_dir / "metrics.jsonl")
        try:
            await supervise(
                self._round_loop(rounds),
                {"receive": self._receive_loop(), "announce": self._announce_loop()},
            )
        finally:
            self._metrics.close()
            await self.gossip.stop()
        return self.rounds_done

    # ---- receiving -------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        while True:
            received = await self.gossip.receive()
            self.handle(received)

    def handle(self, received: Received) -> None:
        """Apply one authenticated message: clock, peers table, pool."""
        envelope = received.envelope
        self._note_heard(envelope.sender)
        if not self.swarm_round.admits(envelope.round):
            self._drop("from_future", envelope.sender)
            if self._vouches(envelope.sender) and self.swarm_round.note_future(
                envelope.sender, envelope.round
            ):
                log.info("caught up with the swarm: round now %d", self.swarm_round.value)
            return
        self.swarm_round.observe(envelope.round)
        message = received.message
        if isinstance(message, Hello):
            self.peers[envelope.sender] = PeerInfo(
                message.model_id,
                message.model_family,
                message.policy_version,
                envelope.round,
                self.clock.now(),
            )
            if len(self.peers) > MAX_PEERS_TRACKED:  # bounded against floods of fresh keys
                oldest = min(self.peers, key=lambda peer: self.peers[peer].last_seen)
                del self.peers[oldest]
        elif isinstance(message, RolloutBatch):
            for group in message.groups:
                if self._own_sources is not None and group.task.source not in self._own_sources:
                    self._drop("foreign_task", envelope.sender)  # counted, not blamed
                    continue
                try:
                    rescored = rescore_group(group, self.config.rewards)
                except Refused as refused:
                    self._drop(refused.reason, envelope.sender)
                    continue
                if rescored.forged:
                    self._drop("forged_rewards", envelope.sender)
                    continue
                if self.pool.add(
                    envelope.sender, envelope.round, group, rescored.rewards, self.swarm_round.value
                ):
                    self.gossip.credit(envelope.sender, CREDIT_PER_GROUP)
                else:
                    self._drop("stale", None)
        elif isinstance(message, DeltaPacket):
            try:
                self.learner.receive_delta(
                    envelope.sender, envelope.round, message, self.swarm_round.value
                )
            except Refused as refused:
                self._drop(refused.reason, envelope.sender)
        else:
            self._drop(f"unexpected_kind_{message.KIND}", envelope.sender)

    def _drop(self, reason: str, sender: str | None) -> None:
        self.drops[reason] += 1
        if sender is not None and reason not in NOT_THE_PEERS_FAULT:
            self.peer_faults[sender] += 1
            if len(self.peer_faults) > MAX_PEERS_TRACKED:
                del self.peer_faults[next(iter(self.peer_faults))]
            self.gossip.penalize(sender, reason)

    def _transport_stats(self) -> dict[str, Any] | None:
        """The transport's own counters (receive-queue drops and bytes), where it has any."""
        stats = getattr(self.gossip.transport, "stats", None)
        return stats() if callable(stats) else None

    def _note_heard(self, sender: str) -> None:
        if sender not in self._first_heard:
            self._first_heard[sender] = self.rounds_done
            if len(self._first_heard) > MAX_PEERS_TRACKED:  # forgetting makes a peer newer
                del self._first_heard[next(iter(self._first_heard))]

    def _vouches(self, sender: str) -> bool:
        """May `sender`'s claim of a later round count toward catching up?"""
        heard = self._first_heard.get(sender, self.rounds_done)
        return (
            self.rounds_done - heard >= self.config.sapo.catch_up_min_rounds
            and self.gossip.scores.in_good_standing(sender)
        )

    async def _announce_loop(self) -> None:
        while True:
            hello = Hello(
                self.learner.model_id,
                self.learner.model_family,
                self.learner.policy_version,
                self.capabilities,
            )
            await self.gossip.publish(self._peers_topic, hello, self.swarm_round.value)
            await self.clock.sleep(ANNOUNCE_EVERY_S)

    # ---- the round loop --------------------------------------------------------------

    async def _round_loop(self, rounds: int | None) -> None:
        target = None if rounds is None else self.rounds_done + rounds
        while target is None or self.rounds_done < target:
            if self.stop_requested.is_set():
                break
            await self.run_round()
        await self.checkpoint()

    async def run_round(self) -> dict[str, Any]:
        sapo = self.config.sapo
        start = self.timer()
        refs = self.tasks.next_refs(sapo.local_groups)
        # Distinct per node (task seed) even when nodes share one initial model.
        seed = (
            self.config.model.seed * 1_000_003 + self.config.tasks.seed * 7_919 + self.rounds_done
        ) & 0x7FFFFFFF
        sampled = await self.offload(self.learner.sample, refs, seed)
        batch = RolloutBatch(
            tuple(
                g.to_wire(self.learner.model_id, self.learner.policy_version)
                for g in sampled.groups
            )
        )
        # Publishing overlaps training: peers get our groups sooner and the round is not
        # held up by the network. It is awaited before the round ends (errors surface).
        publish_task = (
            asyncio.create_task(
                self.gossip.publish(self._rollouts_topic, batch, self.swarm_round.value),
                name="publish",
            )
            if batch.groups
            else None
        )

        try:
            own_round = self.swarm_round.value
            chosen = (
                self.pool.select(sapo.external_groups, own_round) if sapo.external_groups else []
            )
            external = [
                ExternalGroup(e.sender, e.group.prompt, e.group.completions, e.rewards)
                for e in chosen
            ]
            trained = await self.offload(self.learner.train, sampled.groups, external)
            deltas_record = None
            delta_start = self.timer()
            if self._deltas_topic is not None:
                packet, deltas_record = await self.offload(
                    self.learner.share_deltas, self.swarm_round.value
                )
                if packet is not None:
                    await self.gossip.publish(self._deltas_topic, packet, self.swarm_round.value)
            delta_s = self.timer() - delta_start
        except BaseException:
            if publish_task is not None:
                publish_task.cancel()
            raise
        publish_start = self.timer()
        if publish_task is not None:
            await publish_task
        publish_s = self.timer() - publish_start  # only the part not hidden behind training
        self.swarm_round.tick()
        self.rounds_done += 1
        checkpoint_start = self.timer()
        if self.rounds_done % self.config.node.checkpoint_every == 0:
            await self.checkpoint()
        checkpoint_s = self.timer() - checkpoint_start

        local_rewards = [r for g in sampled.groups for r in g.rewards]
        external_rewards = [r for e in external for r in e.rewards]
        total_s = self.timer() - start
        work_s = sampled.sample_s + sampled.score_s + trained.train_s + checkpoint_s + delta_s
        counters = self.gossip.counters.snapshot()
        record: dict[str, Any] = {
            "round": self.rounds_done,
            "swarm_round": self.swarm_round.value,
            "policy_version": self.learner.policy_version,
            "time": self.clock.now(),
            "local_groups": len(sampled.groups),
            "external_groups": len(external),
            "external_by_sender": dict(Counter(e.sender for e in external)),
            "mean_local_reward": statistics.fmean(local_rewards) if local_rewards else None,
            "mean_external_reward": statistics.fmean(external_rewards)
            if external_rewards
            else None,
            "staleness": histogram(self.pool.staleness_of(chosen, own_round)),
            "pool_groups": len(self.pool),
            "peers": len(self.peers),
            "drops": dict(sorted((self.drops + Counter(counters["dropped"])).items())),
            "peer_scores": self.gossip.scores.snapshot(),
            "transport": self._transport_stats(),
            "checkpoint_errors": self.checkpoint_errors,
            "metrics_dropped": self._metrics.dropped if self._metrics is not None else 0,
            "bytes_in": counters["bytes_in"],
            "bytes_out": counters["bytes_out"],
            "seconds": {
                "sample": round(sampled.sample_s, 4),
                "score": round(sampled.score_s, 4),
                "train": round(trained.train_s, 4),
                "publish": round(publish_s, 4),
                "checkpoint": round(checkpoint_s, 4),
                "deltas": round(delta_s, 4),
                "other": round(max(total_s - work_s - publish_s, 0.0), 4),
                "total": round(total_s, 4),
            },
            "train": trained.stats,
            "deltas": deltas_record,
        }
        if self._metrics is not None:
            self._metrics.write(record)
        if self.on_round is not None:
            self.on_round(RoundReport(self.rounds_done, record))
        return record
