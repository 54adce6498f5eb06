"""The peers a node has heard from, as the dashboard and `swarm status` show them.

Invariants:
- A row mixes the peer's own claims (model id, family, policy version: from its hellos,
  shown as claims) with this node's observations (last seen, link, score, and `reward`:
  the mean reward of the peer's groups *as this node re-scored them*, never the peer's
  word).
- `<data_dir>/peers.json` is rewritten once a round by an atomic replace, so a reader
  sees the previous table or the new one, never a torn file; a failed write is logged
  and counted and never stops the node. The node writes it off the event loop, in
  `node.round_outputs`' writer thread (one writer per file: `PeerTableFile` is not
  meant for concurrent writers), which skips a table a newer one replaced before it
  was written.
- At most `MAX_ROWS` rows, the most recently seen first: the file's size is bounded
  whatever the swarm sends.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("swarm.node.peers")

MAX_ROWS = 64
REWARD_EMA = 0.2
"""Weight of the newest re-scored group in a peer's shown reward."""


@dataclass
class PeerInfo:
    """What one node knows of one peer (kept by `node.intake`)."""

    model_id: str
    model_family: str
    policy_version: int
    last_seen: float
    reward: float | None = None
    """Exponential mean (`REWARD_EMA`) of the peer's groups' rewards as we re-scored them."""
    verified_groups: int = 0
    """Groups of this peer that passed our re-scoring."""
    claimed: dict[str, float] = field(default_factory=dict)
    """What its last hello said of its progress (`rounds`, `reward`, `eval`): its word."""

    def note_verified(self, rewards: Collection[float]) -> None:
        if not rewards:
            return
        mean = sum(rewards) / len(rewards)
        self.reward = (
            mean if self.reward is None else self.reward + REWARD_EMA * (mean - self.reward)
        )
        self.verified_groups += 1


def peer_rows(
    peers: Mapping[str, PeerInfo],
    *,
    now: float,
    score: Callable[[str], float],
    ignored: Callable[[str], bool],
    link: Callable[[str], str],
    limit: int = MAX_ROWS,
) -> list[dict[str, Any]]:
    """JSON-ready rows, most recently seen first, at most `limit`."""
    recent = sorted(peers.items(), key=lambda item: item[1].last_seen, reverse=True)[:limit]
    return [
        {
            "peer": peer,
            "model_id": info.model_id,
            "model_family": info.model_family,
            "policy_version": info.policy_version,
            "last_seen_s": round(max(now - info.last_seen, 0.0), 1),
            "link": link(peer),
            "score": round(score(peer), 3),
            "ignored": ignored(peer),
            "reward": None if info.reward is None else round(info.reward, 4),
            "verified_groups": info.verified_groups,
            "claimed": {k: round(v, 4) for k, v in info.claimed.items()},
        }
        for peer, info in recent
    ]


class OwnProgress:
    """What this node tells peers of its progress in its hellos (for their dashboards)."""

    def __init__(self, window: int = 10) -> None:
        self._rewards: deque[float] = deque(maxlen=window)
        self._rounds = 0
        self._eval: float | None = None

    def note(self, record: dict[str, Any]) -> None:
        self._rounds = record["round"]
        if record["mean_local_reward"] is not None:
            self._rewards.append(record["mean_local_reward"])
        if record.get("eval"):
            self._eval = record["eval"]["accuracy"]

    def claim(self) -> tuple[tuple[str, float], ...]:
        out: list[tuple[str, float]] = [("rounds", float(self._rounds))] if self._rounds else []
        if self._rewards:
            out.append(("reward", round(sum(self._rewards) / len(self._rewards), 4)))
        if self._eval is not None:
            out.append(("eval", self._eval))
        return tuple(out)


class PeerTableFile:
    """`<data_dir>/peers.json`, replaced atomically each round."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.failed_writes = 0

    def write(self, rows: list[dict[str, Any]], *, round_: int, time: float) -> None:
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            temporary.write_text(json.dumps({"round": round_, "time": time, "peers": rows}))
            os.replace(temporary, self.path)
        except OSError as exc:
            self.failed_writes += 1
            if self.failed_writes == 1 or self.failed_writes % 100 == 0:
                log.warning("peers table %s not written (%s; %d so far)", self.path, exc,
                            self.failed_writes)  # fmt: skip


def read_peer_table(path: Path) -> dict[str, Any] | None:
    """The last table written, or None (no file yet, or not a table)."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return table if isinstance(table, dict) and isinstance(table.get("peers"), list) else None
