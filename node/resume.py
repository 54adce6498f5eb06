"""What a checkpoint holds of a node beyond its learner, and resuming a node from one.

Invariants:
- `node_state(node)` is `node.json`'s content (schema in `node.checkpoints`): the rounds
  done, the task cursor, each sender's newest seq and version (the replay floors), the
  pool's random state, the peer id, model id and family that wrote it, and a reservation
  of our own seqs: `OWN_SEQ_RESERVE` past the next one.
- Our seqs keep increasing across restarts whatever the clock does: gossip starts them at
  the wall-clock time in microseconds, and a resume moves them past the reservation.
  Peers refuse a seq at or below one they remember of us as a replay, so a node resumed
  with its clock behind its previous run (an NTP step back, a restored VM, a board
  without a real-time clock) was refused until its clock passed the old one. (A crash
  loses the seqs sent since the checkpoint; the reservation covers them.)
- `resume(node)` loads the newest valid checkpoint whose learner files load, skipping
  torn or garbage ones with a warning, and restores everything `node_state` saved; the
  senders' seqs become gossip's replay floors. Nothing is written or removed.
- A newest valid checkpoint of another model that ours cannot load is a `ConfigError`
  naming both (resuming past it would train from scratch and, rounds later, prune that
  model's training); a moved folder of the same model still loads.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from node import checkpoints
from swarm.errors import ConfigError


class Resumable(Protocol):
    """What a checkpoint saves of a node and restores (`node.runner.Node` is one)."""

    rounds_done: int
    data_dir: Path
    learner: Any
    gossip: Any
    pool: Any
    tasks: Any
    own_samples: Any
    sender_versions: Any


log = logging.getLogger("swarm.node")

OWN_SEQ_RESERVE = 10**8
"""Seqs reserved past our next one at each checkpoint: far more than a node sends between
two checkpoints, and a hundred seconds' worth of the wall clock's microseconds (seqs stay
far below 2**53, which JSON peers read exactly, after a million resumes)."""


def node_state(node: Resumable) -> dict[str, Any]:
    return {
        "rounds_done": node.rounds_done,
        "tasks": node.own_samples.tasks_state(),
        "senders": node.sender_versions.state_dict(),
        "pool": node.pool.state_dict(),
        "peer_id": node.gossip.identity.peer_id,
        "model_id": node.learner.model_id,
        "model_family": node.learner.model_family,
        "own_seq_reserved": node.gossip.next_seq + OWN_SEQ_RESERVE,
    }


def resume(node: Resumable) -> Path | None:
    """Load the newest checkpoint that loads cleanly, if any; return its directory."""
    for directory in checkpoints.valid_newest_first(node.data_dir):
        state = checkpoints.read_node_state(directory)
        assert state is not None
        try:
            node.learner.load(directory)
        except (ValueError, OSError) as exc:  # torn or foreign learner files
            theirs = state.get("model_id")
            if theirs is not None and theirs != node.learner.model_id:
                raise checkpoints.foreign_model_error(
                    node.data_dir, directory, theirs, node.learner.model_id
                ) from None
            log.warning("skipping checkpoint %s: %s", directory, exc)
            continue
        node.rounds_done = int(state["rounds_done"])
        node.sender_versions.load_state_dict(state.get("senders", {}))
        node.gossip.remember_seqs(
            {s: seq for s, (seq, _) in node.sender_versions.state_dict().items()}
        )
        if "own_seq_reserved" in state:
            node.gossip.continue_after(int(state["own_seq_reserved"]))
        try:
            node.tasks.load_state_dict(state["tasks"])
        except ValueError as exc:  # another node's (or another seed's) training
            raise ConfigError(
                f"{node.data_dir} holds checkpoints of another task stream ({exc}; newest "
                f"{directory.name}): give this node its own node.data_dir (another node "
                "config using the same folder?), or set tasks.seed back to continue that "
                "training"
            ) from None
        node.pool.load_state_dict(state["pool"])
        log.info("resumed from %s (round %d)", directory, node.rounds_done)
        return directory
    return None
