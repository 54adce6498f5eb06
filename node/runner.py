"""The node: the SAPO round loop plus gossip, as named tasks that fail fast together.

Invariants:
- Tasks: `rounds` (sample, publish, select, train, checkpoint, metrics) and, beside it,
  the peer-facing ones of `node.peer_loops` (`receive`, `admit-<i>`, `announce`,
  `alive`; the admission queue is bounded there). Our batches are paced under peers'
  per-sender rate limits (`node.publish_pacing`).
  A dead task stops the node with its error; nothing the network or a peer causes
  does (gossip counts failed publishes; refusals are counted by reason).
- Sampling and training run through `offload` (a thread in production), so gossip keeps
  flowing while the model works. The next round's own groups are sampled as soon as
  this round's policy is final (prefetch), or, with `Learner.sample_overlap`, while
  this round trains (`node.own_samples`).
- Checkpoints (`node.checkpointing`) are captured at the end of a round and, by default,
  written in the background while the next rounds train; the last one before `run`
  returns is written in full; what `node.json` holds and resuming from it is
  `node.resume`. Each round's metrics line is built by `node.round_record`; its outputs
  (metrics, samples, peer table, logger backends) go through `node.round_outputs`: the
  metrics line before the next round starts, the rest behind, in a writer thread, all
  of it by the time `run` returns.
- Staleness is measured locally (`swarm.staleness`): a group is usable for
  `max_staleness` of our own rounds after it arrived, and while its policy version is
  within `max_version_lag` of what its sender currently runs (the sender's newest
  envelope by seq, `sender_versions`). Nothing a peer sends moves our sense of time, so
  a node that joins late, restarts, or runs 100x slower uses its peers' work from its
  first round, and a peer claiming huge versions only makes its own groups look fresh.
- Replay protection survives restarts: each sender's highest seq is checkpointed
  (`senders` in node.json) and becomes that sender's replay floor in gossip on resume.
- Refusals are counted and blamed by `node.intake`; a peer the scores ignore no longer
  reaches the intake at all.
- A node with J = 0, or alone, runs the same loop on local groups only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gossip.layer import Gossip, Received
from node.checkpointing import Checkpointer
from node.evaluation import HeldOut
from node.identity_proof import identity_work_nonce
from node.intake import Intake
from node.learner import ExternalGroup, Learner, LocalGroup
from node.metrics import round_seconds, write_node_info
from node.model_thread import ModelThread
from node.own_samples import OwnSamples
from node.peer_loops import PeerLoops
from node.peer_table import OwnProgress
from node.pool import Chosen, RolloutPool
from node.publish_pacing import BatchPacer
from node.resume import node_state, resume
from node.round_outputs import RoundOutputs
from node.round_record import round_record
from node.selection import training_batch
from node.supervise import supervise
from node.workers import InlineRescorer, Rescorer
from rewards.mixture import TaskStream
from swarm.clock import Clock
from swarm.config import NodeConfig
from swarm.messages import Hello, RolloutBatch
from swarm.staleness import StalenessRule
from swarm.transport import deltas_topic, peers_topic, rollouts_topic

log = logging.getLogger("swarm.node")

Offload = Callable[..., Awaitable[Any]]


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
        model_offload: Offload | None = None,
        on_round: Callable[[RoundReport], None] | None = None,
        capabilities: tuple[str, ...] = (),
        timer: Callable[[], float] = time.perf_counter,
        rescorer: Rescorer | None = None,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        # Unset seeds come from our key (a no-op where `build_node` derived them).
        config = config.with_node_seeds(gossip.peer_id)
        self.config = config
        self.gossip = gossip
        self.learner = learner
        self.clock = clock
        self.offload = offload
        # The model's work runs on one thread, in order (`node.model_thread`), where
        # offloading means threads; an injected offload (simnet, tests) serves both.
        self.model_offload = model_offload or (
            ModelThread(f"model-{config.node.name}") if offload is asyncio.to_thread else offload
        )
        self.on_round = on_round
        self.capabilities = capabilities
        self.identity_work: int | None = None
        """Our proof of work on our key, where the swarm asks for one (`node.identity_proof`)."""
        self.timer = timer
        self.data_dir = Path(config.node.data_dir)
        sapo = config.sapo
        self.rescorer: Rescorer = rescorer or InlineRescorer(config.rewards, timer)
        self.on_event = on_event
        """Called with ("first_peer", {...}) and ("first_external_group", {...}) once each."""
        self.staleness = StalenessRule(sapo.max_staleness, sapo.max_version_lag, sapo.max_age_s)
        self.pool = RolloutPool.for_node(sapo, self.staleness, config.tasks.seed)
        self.tasks = TaskStream(config.tasks, config.model.seed)
        self.progress = OwnProgress()
        """What our hellos say of our progress (peers show it as our claim)."""
        self.publish_pacer = BatchPacer()
        self.own_samples = OwnSamples(
            config, self.tasks, lambda: self.learner, self.model_offload, offload
        )
        self.held_out = HeldOut(config)
        self.intake = Intake(
            config,
            gossip,
            learner,
            self.pool,
            self.rescorer,
            clock,
            offload,
            on_event,
            held_out_seeds=self.held_out.seeds,
        )
        # The intake's tables, under the names the node has always shown.
        self.sender_versions = self.intake.sender_versions
        self.drops = self.intake.drops
        self.peer_faults = self.intake.peer_faults
        self.peers = self.intake.peers
        self.rounds_done = 0
        self.last_round: int | None = None
        """The round `run` stops after (None: until stopped)."""
        self.started_at: float | None = None
        self.first_external_round: int | None = None
        """The first round that trained on a peer's group."""
        self.stop_requested = asyncio.Event()
        self._rollouts_topic = rollouts_topic(config.node.swarm_id)
        self._peers_topic = peers_topic(config.node.swarm_id)
        self.peer_loops = PeerLoops(
            gossip,
            self.intake,
            clock,
            self._peers_topic,
            hello=self._hello,
            rounds_done=lambda: self.rounds_done,
        )
        self._deltas_topic = (
            deltas_topic(config.node.swarm_id, learner.model_family)
            if config.deltas.enabled
            else None
        )
        self._outputs: RoundOutputs | None = None
        self._wait_s = 0.0
        self.checkpointer = Checkpointer(self.data_dir, offload, config.node.checkpoint_every)
        self._queue_sampling = (
            getattr(self.model_offload, "in_order", False) and self._deltas_topic is None
        )
        """Whether the next round's sampling is queued behind training (see `run_round`)."""

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Releases what the learner holds outside this process (a multi-rank node's other
        training ranks, `node.ranks`); call once the node will not run again."""
        close = getattr(self.learner, "close", None)  # only learners that hold ranks
        if callable(close):
            close()

    def resume(self) -> Path | None:
        """Load the newest checkpoint that loads cleanly, if any (`node.resume`)."""
        return resume(self)

    async def checkpoint(self, *, background: bool = False) -> Path | None:
        """Checkpoint the current round (see `node.checkpointing`): written when this
        returns, or with `background`, captured now and written while training goes on."""
        return await self.checkpointer.checkpoint(
            self.rounds_done, self.learner, node_state(self), background=background
        )

    @property
    def checkpoint_errors(self) -> int:
        return self.checkpointer.errors

    @property
    def last_checkpoint_error(self) -> str | None:
        return self.checkpointer.last_error

    def request_stop(self) -> None:
        self.stop_requested.set()

    @property
    def peer_id(self) -> str:
        return self.gossip.identity.peer_id

    def listen_addrs(self) -> list[str]:
        """Full multiaddrs peers can bootstrap from (empty for transports without any)."""
        listen = getattr(self.gossip.transport, "listen_addrs", None)
        return list(listen()) if callable(listen) else []

    async def run(
        self,
        rounds: int | None,
        on_started: Callable[[], None] | None = None,
        *,
        wait_peers: int = 0,
        wait_timeout_s: float = 60.0,
    ) -> int:
        """Run until `rounds` more rounds are done (None: until stopped). Returns rounds done.

        With `wait_peers > 0`, the first round waits until that many peers have said
        hello, or `wait_timeout_s` passed (then it starts anyway: alone, it still trains).
        """
        await self.rescorer.start()
        try:
            await self._run(rounds, on_started, wait_peers, wait_timeout_s)
        finally:
            await self.rescorer.close()
        return self.rounds_done

    async def _run(
        self,
        rounds: int | None,
        on_started: Callable[[], None] | None,
        wait_peers: int,
        wait_timeout_s: float,
    ) -> None:
        # First: a logging backend that cannot start (package missing) stops us before
        # we join the swarm.
        self._outputs = RoundOutputs(self.config, self.peer_id)
        bits = self.config.gossip.identity_work_bits
        if bits:  # the swarm asks for proof of work on keys: ours before we join
            self.identity_work = await asyncio.to_thread(
                identity_work_nonce, self.data_dir, self.config.node.swarm_id, self.peer_id, bits
            )
        try:
            await self._run_joined(rounds, on_started, wait_peers, wait_timeout_s)
        finally:
            await self.own_samples.drain()
            await self.checkpointer.settle_quietly()  # stopping on an error: finish the write
            self._outputs.close()
            if isinstance(self.model_offload, ModelThread):
                self.model_offload.close()

    async def _run_joined(
        self,
        rounds: int | None,
        on_started: Callable[[], None] | None,
        wait_peers: int,
        wait_timeout_s: float,
    ) -> None:
        await self.gossip.start()
        await self.gossip.subscribe(self._rollouts_topic)
        await self.gossip.subscribe(self._peers_topic)
        if self._deltas_topic is not None:
            await self.gossip.subscribe(self._deltas_topic)
        self.started_at = self.intake.started_at = self.clock.now()
        # Who is running here, for the dashboard (its own id and listen addresses).
        write_node_info(self.data_dir, peer_id=self.peer_id, listen=self.listen_addrs())
        if on_started is not None:
            on_started()
        background = self.peer_loops.tasks()
        try:
            await supervise(self._round_loop(rounds, wait_peers, wait_timeout_s), background)
        finally:
            await self.gossip.stop()

    # ---- what peers see and send -----------------------------------------------------

    async def take(self, received: Received) -> None:
        """Handle then admit at once (simnet and tests: no queue in between)."""
        await self.peer_loops.take(received)

    @property
    def first_peer_at(self) -> float | None:
        return self.intake.first_peer_at

    def _transport_stats(self) -> dict[str, Any] | None:
        """The transport's own counters (receive-queue drops and bytes), where it has any."""
        stats = getattr(self.gossip.transport, "stats", None)
        return stats() if callable(stats) else None

    def _hello(self) -> Hello:
        """Who we are, what we run and how far we are, as our hellos say it."""
        return Hello(
            self.learner.model_id,
            self.learner.model_family,
            self.learner.policy_version,
            self.capabilities,
            self.progress.claim(),
            self.identity_work,
        )

    # ---- the round loop --------------------------------------------------------------

    async def _round_loop(self, rounds: int | None, wait_peers: int, wait_timeout_s: float) -> None:
        if wait_peers > 0:
            await self.intake.wait_for_peers(wait_peers, wait_timeout_s, self.stop_requested)
        target = self.last_round = None if rounds is None else self.rounds_done + rounds
        while target is None or self.rounds_done < target:
            if self.stop_requested.is_set():
                break
            await self.run_round()
        await self.checkpoint()

    async def _publish_own(
        self, groups: Sequence[LocalGroup], sampled_version: int, version: int
    ) -> None:
        """Our groups, sampled at `sampled_version`, published as of policy `version`
        (with a later round's when rounds come faster than peers take batches:
        `node.publish_pacing`)."""
        learner = self.learner
        family = learner.model_family
        wire = [g.to_wire(learner.model_id, sampled_version, family) for g in groups]
        batch = self.publish_pacer.offer(wire, self.clock.now())
        if batch is not None:
            await self.gossip.publish(self._rollouts_topic, RolloutBatch(batch), version)

    async def run_round(self) -> dict[str, Any]:
        """One SAPO round: sample (or take what was sampled ahead), choose peers' groups,
        train on both while publishing ours, share deltas, checkpoint, record."""
        start = self.timer()
        # Held-out accuracy at the start of every `eval.every`-th round (round 0: before
        # any training).
        evaluation = await self.held_out.evaluate(
            self.learner, self.model_offload, self.rounds_done
        )
        eval_s = self.timer() - start
        sampled, sample_wait_s = await self.own_samples.take(self.rounds_done)
        sampled_version = (
            sampled.policy_version
            if sampled.policy_version is not None
            else self.learner.policy_version
        )
        local = training_batch(sampled.groups, self.config.sapo.local_groups)  # S > I
        chosen = self.pool.choose(
            self.config.sapo.external_groups,  # none with J = 0
            self.rounds_done,
            self.intake.sender_version,
            self.clock.now(),
            [g.prompt for g in local],
        )
        done = await self._train_publish_and_share(sampled.groups, sampled_version, local, chosen)
        self._note_first_external(chosen.external)
        self.rounds_done += 1
        checkpoint_start = self.timer()
        if self.rounds_done % self.config.node.checkpoint_every == 0:
            await self.checkpoint(background=self.config.node.background_checkpoints)
        checkpoint_s = self.timer() - checkpoint_start
        seconds = round_seconds(
            self.timer() - start,
            critical={
                # Sampled ahead (prefetch, overlap): only the wait is this round's.
                "sample_wait": sample_wait_s,
                "train": done.trained.train_s,
                "publish": done.publish_s,
                "checkpoint": checkpoint_s,
                "deltas": done.deltas_s,
                "eval": eval_s,
            },
            compute={"sample": sampled.sample_s, "score": sampled.score_s},
        )
        record = round_record(
            self,
            sampled=sampled,
            sampled_version=sampled_version,
            external=chosen.external,
            ages=chosen.ages,
            lags=chosen.lags,
            trained=done.trained,
            deltas=done.deltas_record,
            evaluation=evaluation,
            seconds=seconds,
            admission_queue=self.peer_loops.admission_queue,
            transport=self._transport_stats(),
            metrics_dropped=self._outputs.metrics_dropped if self._outputs is not None else 0,
        )
        self._emit_round(record, sampled.groups)
        return record

    async def _train_publish_and_share(
        self,
        groups: Sequence[LocalGroup],
        sampled_version: int,
        local: Sequence[LocalGroup],
        chosen: Chosen,
    ) -> _Trained:
        """Train on `local` + the chosen groups; meanwhile publish our `groups` and start
        sampling the next round as early as its policy allows; then share deltas."""
        more = self.last_round is None or self.rounds_done + 1 < self.last_round
        next_round = self.rounds_done + 1
        if more and not self.stop_requested.is_set():
            self.own_samples.sample_ahead(next_round)  # with sampler.overlap
        # Prefetch (below) not before a held-out evaluation, which would wait for it.
        sample_next = more and not self.held_out.due(next_round)
        publish_task: asyncio.Task[None] | None = None
        try:
            training = asyncio.ensure_future(
                self.model_offload(self.learner.train, local, chosen.external)
            )
            # On an in-order model thread, and with no deltas to merge after training, the
            # next round's sampling is queued right behind this training: the policy it
            # reads is final when it starts, and the model does not wait for the loop.
            queued = self._queue_sampling
            if queued and sample_next and not self.stop_requested.is_set():
                self.own_samples.prefetch(next_round)
            # Publishing overlaps training (the worker starts first): peers get our groups
            # sooner and the round is not held up by the network. Awaited before the round
            # ends, so errors surface.
            if groups:
                publish_task = asyncio.create_task(
                    self._publish_own(groups, sampled_version, self.learner.policy_version),
                    name="publish",
                )
            trained = await training
            deltas_record = packet = None
            delta_start = self.timer()
            if self._deltas_topic is not None:
                packet, deltas_record = await self.model_offload(
                    self.learner.share_deltas, self.rounds_done
                )
            if not queued and sample_next and not self.stop_requested.is_set():
                # The next round's policy is final: sample it while this round finishes.
                # The yield hands it to the worker now, not after this round's bookkeeping.
                self.own_samples.prefetch(next_round)
                await asyncio.sleep(0)
            if packet is not None:
                assert self._deltas_topic is not None
                await self.gossip.publish(self._deltas_topic, packet, self.learner.policy_version)
            deltas_s = self.timer() - delta_start
        except BaseException:
            if publish_task is not None:
                publish_task.cancel()
            raise
        publish_start = self.timer()
        if publish_task is not None:
            await publish_task
        publish_s = self.timer() - publish_start  # only the part not hidden behind training
        return _Trained(trained, deltas_record, deltas_s, publish_s)

    def _note_first_external(self, external: Sequence[ExternalGroup]) -> None:
        """Log (and report) the first round that trains on peers' groups."""
        if not external or self.first_external_round is not None:
            return
        self.first_external_round = self.rounds_done + 1
        after = round(self.clock.now() - (self.started_at or self.clock.now()), 3)
        log.info("first external group used in round %d (%.1f s after start)",
                 self.first_external_round, after)  # fmt: skip
        if self.on_event is not None:
            info = {"round": self.first_external_round, "after_s": after}
            self.on_event("first_external_group", {**info, "groups": len(external)})

    def _emit_round(self, record: dict[str, Any], groups: Sequence[LocalGroup]) -> None:
        """The round's record to progress, the outputs (metrics line first) and the
        caller's callback."""
        self.progress.note(record)
        if self._outputs is not None:
            self._outputs.write(record, groups, self.intake.peer_rows())
        if self.on_round is not None:
            self.on_round(RoundReport(self.rounds_done, record))


@dataclass(frozen=True)
class _Trained:
    """What training and sharing gave a round, with the seconds they held it up."""

    trained: Any
    deltas_record: dict[str, Any] | None
    deltas_s: float
    publish_s: float
