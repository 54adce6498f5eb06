"""What a node does with authenticated messages from peers, before its round loop.

`Intake.handle` notes each message at once (the peers table, the sender's current
policy version) and returns the rollouts or delta to admit; `Intake.admit` re-scores a
batch's groups into the pool (through the `Rescorer`) or hands a delta to the learner
(through `offload`). The node queues admissions between the two (`node.runner`).

Invariants:
- Nothing a peer chooses runs here on the event loop: re-scoring goes to the rescorer,
  delta decoding to `offload`.
- Every refusal is counted by reason in `drops`; those that are the peer's fault (not
  in `NOT_THE_PEERS_FAULT`) are reported to gossip's peer scores, and every group that
  enters the pool earns its sender `CREDIT_PER_GROUP`.
- Staleness is judged with numbers measured here: the arrival round and time stamped by
  `handle`, and `sender_versions` (each sender's newest envelope by seq).
- With `sapo.drop_copies`, a group whose question and completions another sender's
  accepted group already had is dropped (`copied_group`, counted, not blamed: the copy
  may have won the race to us).
  Nobody samples another node's 8 completions by chance, so copies are re-sent work:
  they would train one group twice and let a key farm the cohort of an honest peer's
  arrival (`node.trust`). The owners of the last `MAX_GROUP_OWNERS` accepted groups are
  kept.
- With `gossip.identity_work_bits`, a sender's rollouts and deltas are admitted only
  once a hello of its carried that much proof of work on its key; until then they are
  dropped as `no_identity_work` (counted, not blamed), as is a hello without it (and it
  does not enter the peers table).
- Memory is bounded: the peers table, fault counts and sender versions keep at most
  `MAX_PEERS_TRACKED` peers (least recently seen forgotten first; in the peers table,
  peers with verified groups only once no unverified one is among the oldest
  `EVICTION_SCAN`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gossip.layer import Gossip, Received
from node.learner import Learner
from node.peer_table import PeerInfo, peer_rows
from node.pool import RolloutPool
from node.rescore import Refused
from node.selection import trainable_mask, trainable_share
from node.workers import Rescorer
from rewards.mixture import wire_source
from swarm.bounded import BoundedDict
from swarm.clock import Clock
from swarm.config import NodeConfig
from swarm.envelope import Envelope
from swarm.identity_work import has_work
from swarm.messages import DeltaPacket, Hello, RolloutBatch
from swarm.staleness import SenderVersions

log = logging.getLogger("swarm.node")

Offload = Callable[..., Awaitable[Any]]
MAX_PEERS_TRACKED = 4096
EVICTION_SCAN = 256
NOT_THE_PEERS_FAULT = frozenset(
    {
        "zero_variance",
        "no_trainable_signal",
        "stale",
        "stale_version",
        "pending_full",
        "deltas_disabled",
        "wrong_scheme",
        "foreign_task",
        "held_out_task",
        "admission_full",
        "rescore_queue_full",
        "nondeterministic_task",
        "copied_group",
    }
)
MAX_GROUP_OWNERS = 16384
"""Accepted groups whose first sender is remembered (for `copied_group`)."""
CREDIT_PER_GROUP = 0.5
"""Score credit for a peer's group that passed re-scoring and entered the pool."""
WAIT_POLL_S = 0.2
"""How often `wait_for_peers` looks at the peers table."""


@dataclass(frozen=True)
class Admission:
    """A received rollout batch or delta waiting to be re-scored or decoded."""

    envelope: Envelope
    message: RolloutBatch | DeltaPacket
    arrival_round: int
    arrival_time: float


class Intake:
    """The receive side of one node; see the module docstring."""

    def __init__(
        self,
        config: NodeConfig,
        gossip: Gossip,
        learner: Learner,
        pool: RolloutPool,
        rescorer: Rescorer,
        clock: Clock,
        offload: Offload,
        on_event: Callable[[str, dict[str, Any]], None] | None,
        held_out_seeds: frozenset[int] = frozenset(),
    ) -> None:
        self.gossip = gossip
        self.learner = learner
        self.pool = pool
        self.rescorer = rescorer
        self.clock = clock
        self.offload = offload
        self.on_event = on_event
        self.wants_rollouts = config.sapo.external_groups > 0
        """A node with J = 0 never trains on peers' groups: it re-scores none."""
        self.own_sources: frozenset[str] | None = (
            None
            if config.tasks.accept_foreign
            else frozenset(wire_source(spec) for spec in config.tasks.mixture)
        )
        self.trajectory_rule = config.train.foreign_trajectory
        """Which peers' completions our trainer trains (`policy.trajectories`)."""
        self.held_out_seeds = held_out_seeds
        """Task seeds of our held-out set: never trained on (`node.evaluation`)."""
        self.sender_versions = SenderVersions(MAX_PEERS_TRACKED)
        self.drops: Counter[str] = Counter()
        self.peer_faults: Counter[str] = Counter()
        self.peers: OrderedDict[str, PeerInfo] = OrderedDict()
        self.started_at: float | None = None
        self.first_peer_at: float | None = None
        """Clock time of the first hello from a peer (None: alone so far)."""
        self.new_peer = asyncio.Event()
        """Set by a hello from a peer not in the table (the node answers with its own)."""
        self.swarm_id = config.node.swarm_id
        self.work_bits = config.gossip.identity_work_bits
        self.proven: BoundedDict[str, bool] = BoundedDict(MAX_PEERS_TRACKED)
        """Senders whose hello carried enough proof of work on their key (with
        `work_bits`; `swarm.identity_work`)."""
        self.drop_copies = config.sapo.drop_copies
        self.group_owners: BoundedDict[bytes, str] = BoundedDict(MAX_GROUP_OWNERS)
        """Digest of an accepted group's question and completions -> its first sender."""

    async def wait_for_peers(self, count: int, timeout_s: float, stop: asyncio.Event) -> None:
        """Until `count` peers said hello, `timeout_s` passed or `stop` is set."""
        deadline = self.clock.now() + timeout_s
        while len(self.peers) < count and self.clock.now() < deadline:
            if stop.is_set():
                return
            await self.clock.sleep(WAIT_POLL_S)
        if len(self.peers) < count:
            log.warning("waited %.0f s for %d peer(s), have %d: starting anyway",
                        timeout_s, count, len(self.peers))  # fmt: skip

    def peer_rows(self) -> list[dict[str, Any]]:
        """The peer table (`node.peer_table`): a peer is `direct` while we hold a direct
        connection to it, `relayed` while we hold only a `/p2p-circuit` connection to it
        through a relay, else `indirect` (its messages reach us through other peers or a
        broker, or it has left: see its last-seen time)."""
        transport = self.gossip.transport
        links_of = getattr(transport, "peer_links", None)  # libp2p tells relayed links apart
        links = (
            links_of() if links_of is not None
            else dict.fromkeys(transport.connected_peers(), "direct")
        )  # fmt: skip
        scores = self.gossip.scores
        return peer_rows(
            self.peers,
            now=self.clock.now(),
            score=scores.score,
            ignored=scores.is_ignored,
            link=lambda peer: links.get(peer, "indirect"),
        )

    def sender_version(self, sender: str) -> int:
        return self.sender_versions.version(sender)

    def handle(self, received: Received, own_round: int) -> Admission | None:
        """Note one authenticated message (peers table, the sender's current version);
        return the rollouts or delta to admit, stamped with `own_round` and time now."""
        envelope = received.envelope
        self.sender_versions.observe(envelope.sender, envelope.seq, envelope.policy_version)
        message = received.message
        if isinstance(message, Hello):
            if self._has_work(envelope.sender, message):
                self._note_hello(envelope.sender, message)
            return None
        if isinstance(message, RolloutBatch) and not self.wants_rollouts:
            return None
        if isinstance(message, (RolloutBatch, DeltaPacket)):
            if self.work_bits and envelope.sender not in self.proven:
                # Not blamed: its hello (with the work) may just not have come yet.
                self.drop("no_identity_work", None)
                return None
            return Admission(envelope, message, own_round, self.clock.now())
        self.drop(f"unexpected_kind_{message.KIND}", envelope.sender)
        return None

    def _has_work(self, sender: str, hello: Hello) -> bool:
        """Whether `sender` did the swarm's proof of work on its key (always, with none
        asked); a hello without it is counted and not noted (so a flood of fresh keys
        cannot fill the peers table either)."""
        if not self.work_bits or sender in self.proven:
            return True
        if has_work(self.swarm_id, sender, hello.work, self.work_bits):
            self.proven[sender] = True
            return True
        self.drop("no_identity_work", None)
        return False

    def _note_hello(self, sender: str, hello: Hello) -> None:
        now = self.clock.now()
        if sender not in self.peers:
            self.new_peer.set()
            if self.first_peer_at is None:
                self.first_peer_at = now
                waited = now - self.started_at if self.started_at is not None else 0.0
                log.info("first peer %s (%s) %.1f s after this node joined the swarm",
                         sender, hello.model_id, waited)  # fmt: skip
                if self.on_event is not None:
                    self.on_event(
                        "first_peer",
                        {"peer": sender, "model_id": hello.model_id, "after_s": round(waited, 3)},
                    )
        known = self.peers.get(sender)
        if known is None:
            info = PeerInfo(hello.model_id, hello.model_family, hello.policy_version, now)
            info.claimed = dict(hello.progress)
            self.peers[sender] = info
        else:  # keep what we measured of it (re-scored rewards)
            known.model_id, known.model_family = hello.model_id, hello.model_family
            known.policy_version, known.last_seen = hello.policy_version, now
            known.claimed = dict(hello.progress)
        self.peers.move_to_end(sender)
        if len(self.peers) > MAX_PEERS_TRACKED:  # bounded against floods of fresh keys
            del self.peers[self._peer_to_forget()]

    def _peer_to_forget(self) -> str:
        """The least recently seen peer none of whose groups we verified, among the
        `EVICTION_SCAN` least recently seen; else the least recently seen. So a flood of
        hellos from fresh keys (8,538 in issue 31) cannot push out the peers that gave us
        groups we trained on."""
        oldest = None
        for i, (peer, info) in enumerate(self.peers.items()):
            oldest = oldest or peer
            if info.verified_groups == 0 or i >= EVICTION_SCAN:
                return peer if info.verified_groups == 0 else oldest
        assert oldest is not None
        return oldest

    async def admit(self, admission: Admission) -> None:
        """Re-score a batch's groups into the pool, or hold a delta for the next merge."""
        sender = admission.envelope.sender
        if isinstance(admission.message, DeltaPacket):
            try:
                await self.offload(
                    self.learner.receive_delta,
                    sender,
                    admission.envelope.policy_version,
                    admission.message,
                    admission.arrival_round,
                )
            except Refused as refused:
                self.drop(refused.reason, sender)
            return
        for group in admission.message.groups:
            if self.own_sources is not None and group.task.source not in self.own_sources:
                self.drop("foreign_task", sender)  # counted, not blamed
                continue
            if group.task.seed in self.held_out_seeds:
                self.drop("held_out_task", sender)  # counted, not blamed
                continue
            digest = group_digest(group.prompt, group.completions)
            owner = self.group_owners.get(digest) if self.drop_copies else None
            if owner is not None and owner != sender:
                self.drop("copied_group", sender)  # counted, not blamed
                continue
            try:
                rescored = await self.rescorer.rescore(group)
            except Refused as refused:
                self.drop(refused.reason, sender)
                continue
            if rescored.forged:
                self.drop("forged_rewards", sender)
                continue
            share = trainable_share(
                rescored.rewards, trainable_mask(group.finished, self.trajectory_rule)
            )
            if share == 0.0:  # e.g. only unfinished completions differ: nothing to train
                self.drop("no_trainable_signal", sender)  # counted, not blamed
                continue
            refused_by_pool = self.pool.add(
                sender,
                group,
                rescored.rewards,
                own_round=admission.arrival_round,
                sender_version=self.sender_version(sender),
                now=admission.arrival_time,
                trainable_share=share,
                network=self.gossip.peer_network(sender),
            )
            if refused_by_pool is None:
                if self.drop_copies:
                    self.group_owners[digest] = sender
                self.gossip.credit(sender, CREDIT_PER_GROUP)
                if sender in self.peers:
                    self.peers[sender].note_verified(rescored.rewards)
            else:
                self.drop(refused_by_pool, None)  # the sender's own claims, or our size

    def drop(self, reason: str, sender: str | None) -> None:
        """Count a refusal; blame `sender` unless the reason is not its fault."""
        self.drops[reason] += 1
        if sender is not None and reason not in NOT_THE_PEERS_FAULT:
            self.peer_faults[sender] += 1
            self.pool.trust.note_blamed(sender)  # its cohort's age starts again
            if len(self.peer_faults) > MAX_PEERS_TRACKED:
                del self.peer_faults[next(iter(self.peer_faults))]
            self.gossip.penalize(sender, reason)


def group_digest(prompt: str, completions: tuple[str, ...]) -> bytes:
    """What makes two groups copies of each other: the question and every completion,
    in order (unambiguous: each text length-prefixed)."""
    digest = hashlib.sha256()
    for text in (prompt, *completions):
        data = text.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.digest()
