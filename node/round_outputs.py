"""Everything a finished round writes for people: metrics, samples, peers, logger backends.

Invariants:
- `<data_dir>/metrics.jsonl` gets the round's full record (the source of truth every
  view reads: `swarm status`, the dashboard, Prometheus), written in `write`, so the line
  is complete before the next round starts (`node.metrics`).
- The rest is written behind, off the event loop, by one worker thread running the
  rounds' jobs in order: `samples.jsonl` the round's own groups (when
  `node.samples_keep` > 0), `peers.json` the peer table (atomic replace), the configured
  logging backends the record's scalars; after `metrics.jsonl` rotates, its segments
  are compressed and pruned (`node.metrics_segments.tidy`). `peers.json` is only ever
  replaced by the newest table handed over: a job that finds a newer table pending
  writes that one, and a table already superseded is skipped, so the file never goes
  back in time.
- At most `MAX_BEHIND` rounds wait for the worker; past that (a disk that hangs) a round's
  samples and backend scalars are dropped and counted (`dropped_behind`), never
  queued without bound. Its peer table is still handed over: a queued job writes it
  (or a newer one).
- `close` waits for every job handed over, so when a node's `run` returns all its files
  are as of its last round. A SIGKILL loses at most the rounds still behind (samples and
  peer tables are for reading, not for resuming; every file stays whole: samples lines
  are appended whole and trimmed by a rename, the peer table replaced by a rename).
- None of these writes stops the node: each counts and logs its own I/O failures (see the
  writer modules). Any other exception in the worker is a bug: it is raised by the next
  `write`, or logged by `close` (the node is stopping anyway).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.learner import LocalGroup
from node.logging_backends import MetricBackends, scalars
from node.metrics import MetricsWriter
from node.metrics_segments import tidy
from node.peer_table import PeerTableFile
from node.samples import SamplesLog, group_records
from swarm.config import NodeConfig

log = logging.getLogger("swarm.node")

MAX_BEHIND = 32
"""Rounds whose samples / backend scalars may wait for the writer thread (at least 2:
one being written, one queued to take the newest peer table)."""


@dataclass(frozen=True)
class _RoundWork:
    """One round's share of the writer thread's work."""

    round: int
    version: int
    groups: tuple[LocalGroup, ...]
    scalars: dict[str, float] | None


class RoundOutputs:
    def __init__(self, config: NodeConfig, peer_id: str) -> None:
        data_dir = Path(config.node.data_dir)
        self.metrics = MetricsWriter(
            data_dir / "metrics.jsonl", rotate_bytes=config.node.metrics_rotate_mb << 20
        )
        keep_mb = config.node.metrics_keep_mb
        self._metrics_keep_bytes = keep_mb << 20 if keep_mb > 0 else None
        keep = config.node.samples_keep
        self.samples = SamplesLog(data_dir / "samples.jsonl", keep) if keep > 0 else None
        self.peers = PeerTableFile(data_dir / "peers.json")
        self.backends = MetricBackends.open(
            config.logging,
            data_dir,
            run_name=config.node.name,
            run_id=f"{config.node.name}-{peer_id[-12:]}",
            settings=config.model_dump(mode="json"),
        )
        self.dropped_behind = 0
        """Rounds whose samples and backend scalars were dropped: the writer was behind."""
        self._lock = threading.Lock()
        self._table: tuple[list[dict[str, Any]], int, float] | None = None
        """The newest peer table not written yet (guarded by `_lock`)."""
        self._behind = 0
        """Jobs handed over and not finished (guarded by `_lock`)."""
        self._worker: ThreadPoolExecutor | None = None
        self._failure: BaseException | None = None

    @property
    def metrics_dropped(self) -> int:
        return self.metrics.dropped

    def write(
        self,
        record: dict[str, Any],
        groups: Sequence[LocalGroup],
        peer_rows: list[dict[str, Any]],
    ) -> None:
        """The metrics line now; the rest handed to the writer thread (see the module)."""
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure
        self.metrics.write(record)
        if self.metrics.take_rotated() is not None:
            # Rare (one per metrics_rotate_mb) and never dropped: not counted as behind.
            self._submit(tidy, self.metrics.path, self._metrics_keep_bytes)
        with self._lock:
            self._table = (peer_rows, record["round"], record["time"])
            behind = self._behind
            if behind < MAX_BEHIND:
                self._behind += 1
        if behind >= MAX_BEHIND:
            # Jobs are queued that have not started yet: the first of them writes this
            # table (or a newer one).
            self.dropped_behind += 1
            if self.dropped_behind == 1 or self.dropped_behind % 100 == 0:
                log.warning("round outputs: the writer is %d rounds behind; samples and "
                            "logger scalars of %d round(s) dropped", behind,
                            self.dropped_behind)  # fmt: skip
            return
        # What the thread needs of the round, taken now: it shares nothing with the loop
        # but the peer table slot (the rows are built for it) and the writers it owns.
        work = _RoundWork(
            record["round"],
            record["sampled_version"],
            tuple(groups) if self.samples is not None else (),
            scalars(record) if self.backends.active else None,
        )
        self._submit(self._write_behind, work)

    def _submit(self, fn: Callable[..., None], *args: Any) -> None:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="round-outputs")
        job = self._worker.submit(fn, *args)
        job.add_done_callback(self._note_failure)

    def _write_behind(self, work: _RoundWork) -> None:
        """In the writer thread: one round's samples and scalars, then the newest table."""
        try:
            if self.samples is not None and work.groups:
                self.samples.append(group_records(work.round, work.version, work.groups))
            if work.scalars is not None:
                self.backends.log_scalars(work.scalars, work.round)
        finally:
            with self._lock:
                table, self._table = self._table, None
            try:
                if table is not None:
                    rows, round_, time = table
                    self.peers.write(rows, round_=round_, time=time)
            finally:
                with self._lock:
                    self._behind -= 1

    def _note_failure(self, job: Future[None]) -> None:
        if not job.cancelled() and job.exception() is not None and self._failure is None:
            self._failure = job.exception()

    def flush(self) -> None:
        """Wait until everything handed over is written (the writer thread then ends)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.shutdown(wait=True)

    def close(self) -> None:
        self.flush()
        if self._failure is not None:
            log.error("round outputs: the writer thread failed: %r", self._failure)
            self._failure = None
        self.metrics.close()
        self.backends.close()
