"""Everything a finished round writes for people: metrics, samples, peers, logger backends.

Invariants:
- `<data_dir>/metrics.jsonl` gets the round's full record (the source of truth every
  view reads: `swarm status`, the dashboard, Prometheus); `samples.jsonl` the round's own
  groups (when `node.samples_keep` > 0); `peers.json` the peer table (atomic replace);
  the configured logging backends the record's scalars.
- None of these writes raises: each counts and logs its own failures (see the writer
  modules), so a full disk or a logger outage never stops a node.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from node.learner import LocalGroup
from node.logging_backends import MetricBackends
from node.metrics import MetricsWriter
from node.peer_table import PeerTableFile
from node.samples import SamplesLog, group_records
from swarm.config import NodeConfig


class RoundOutputs:
    def __init__(self, config: NodeConfig, peer_id: str) -> None:
        data_dir = Path(config.node.data_dir)
        self.metrics = MetricsWriter(data_dir / "metrics.jsonl")
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

    @property
    def metrics_dropped(self) -> int:
        return self.metrics.dropped

    def write(
        self,
        record: dict[str, Any],
        groups: Sequence[LocalGroup],
        peer_rows: list[dict[str, Any]],
    ) -> None:
        self.metrics.write(record)
        if self.samples is not None:
            self.samples.append(group_records(record["round"], record["sampled_version"], groups))
        self.peers.write(peer_rows, round_=record["round"], time=record["time"])
        self.backends.log(record)

    def close(self) -> None:
        self.metrics.close()
        self.backends.close()
