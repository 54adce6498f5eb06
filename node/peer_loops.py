"""The node's side facing its peers: the tasks that run beside the round loop.

Invariants:
- Tasks (`tasks()`, supervised with the round loop by `node.supervise`): `receive`
  (gossip already authenticated; `Intake.handle` updates the peers and sender-version
  tables, and rollouts and deltas are queued for admission without waiting on them),
  `admit-<i>` (`Intake.admit`: re-scoring through the rescorer, delta decoding through
  `offload`: nothing a peer chooses runs on the event loop), `announce` (hello on the
  peers topic, at once again when a new peer said hello, at most once a second) and
  `alive` (a tick to the rate limiter, so that a stall of this process is not charged
  to peers: `gossip.ratelimit`).
- The admission queue is bounded (`ADMISSION_QUEUE`); a batch that does not fit is
  dropped and counted as `admission_full` (our capacity, not the peer's fault).
- Nothing here trains or samples; what a hello says comes from the node (`hello`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from gossip.layer import Gossip, Received
from gossip.ratelimit import ALIVE_TICK_S
from node.intake import Admission, Intake
from node.silence import SilenceWatch, real_connections
from swarm.clock import Clock
from swarm.messages import Hello

log = logging.getLogger("swarm.node")

ANNOUNCE_EVERY_S = 5.0
GREET_MIN_INTERVAL_S = 1.0
"""A hello from a new peer is answered with ours at once, at most this often (so two
nodes find each other in one round trip, and fresh keys cannot make us chatty)."""
ADMISSION_QUEUE = 256
"""Received rollout batches and deltas waiting for re-scoring / decoding."""
ADMISSION_WORKERS = 2
"""Concurrent admissions (each waits on the rescorer or a decoding thread)."""


class PeerLoops:
    """Receiving, admitting, announcing and the liveness tick of one node.

    `hello` builds our current hello and `rounds_done` says how many rounds we finished
    (the intake dates what it receives by our own rounds)."""

    def __init__(
        self,
        gossip: Gossip,
        intake: Intake,
        clock: Clock,
        peers_topic: str,
        *,
        hello: Callable[[], Hello],
        rounds_done: Callable[[], int],
    ) -> None:
        self.gossip, self.intake, self.clock = gossip, intake, clock
        self._peers_topic = peers_topic
        self._hello, self._rounds_done = hello, rounds_done
        self._silence = SilenceWatch()
        self._admissions: asyncio.Queue[Admission] | None = None

    @property
    def admission_queue(self) -> int:
        """Batches waiting for admission now (0 before the tasks started)."""
        return self._admissions.qsize() if self._admissions is not None else 0

    def tasks(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The named tasks to run beside the round loop (once per run)."""
        self._admissions = asyncio.Queue(ADMISSION_QUEUE)
        tasks = {
            "receive": self._receive_loop(),
            "announce": self._announce_loop(),
            "alive": self._alive_loop(),
        }
        for i in range(ADMISSION_WORKERS):
            tasks[f"admit-{i}"] = self._admit_loop()
        return tasks

    async def take(self, received: Received) -> None:
        """Handle then admit at once (simnet and tests: no queue in between)."""
        admission = self.intake.handle(received, self._rounds_done())
        if admission is not None:
            await self.intake.admit(admission)

    async def _receive_loop(self) -> None:
        assert self._admissions is not None
        while True:
            received = await self.gossip.receive()
            admission = self.intake.handle(received, self._rounds_done())
            if admission is None:
                continue
            try:
                self._admissions.put_nowait(admission)
            except asyncio.QueueFull:
                self.intake.drop("admission_full", None)

    async def _admit_loop(self) -> None:
        assert self._admissions is not None
        while True:
            admission = await self._admissions.get()
            await self.intake.admit(admission)

    async def _alive_loop(self) -> None:
        while True:
            self.gossip.note_alive()
            await self.clock.sleep(ALIVE_TICK_S)

    async def _announce_loop(self) -> None:
        while True:
            hello = self._hello()
            self.intake.new_peer.clear()
            await self.gossip.publish(self._peers_topic, hello, hello.policy_version)
            silent = self._silence.observe(
                self.clock.now(), real_connections(self.gossip.transport),
                self.gossip.counters.messages_in,
            )  # fmt: skip
            if silent is not None:
                log.warning("%s", silent)
            await self.clock.sleep(GREET_MIN_INTERVAL_S)
            # The next hello: periodic, or sooner when a new peer said hello meanwhile.
            greeted = asyncio.ensure_future(self.intake.new_peer.wait())
            await asyncio.wait({greeted}, timeout=ANNOUNCE_EVERY_S - GREET_MIN_INTERVAL_S)
            greeted.cancel()
