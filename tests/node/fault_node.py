"""`swarm` CLI with a fault hook, for process tests: stops dead in the middle of a
checkpoint write so the test can SIGKILL the process exactly there.

Run as `python -m tests.node.fault_node <swarm arguments>`. The environment chooses the
fault (production code carries no test hooks; this script patches it in its own process):

- `SWARM_FAULT=tensor_write`: in the learner's save, half of `model.safetensors` is
  written into the hidden temporary directory, then the process hangs.
- `SWARM_FAULT=node_state`: the learner's directory has been renamed into place; half of
  `.node.json.tmp` is written and `node.json` is not, then the process hangs.
- `SWARM_FAULT_ROUND`: the checkpoint round at which the fault fires (others are normal).
- `SWARM_FAULT_MARKER`: a file created (after the partial data is fsynced) once hanging.

Without `SWARM_FAULT` this is exactly `python -m cli.main`.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import node.checkpoints
import policy.checkpoint
from cli.main import app

_TEMP_OF_ROUND = re.compile(r"^\.round-(\d{8})\.tmp-")


def _hang(marker: Path) -> None:
    marker.write_text(str(os.getpid()))
    while True:  # until SIGKILL
        time.sleep(60)


def _write_half(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data[: len(data) // 2])
        f.flush()
        os.fsync(f.fileno())


def install(fault: str, at_round: int, marker: Path) -> None:
    if fault == "tensor_write":
        real_save_file = policy.checkpoint.save_file

        def save_file(
            tensors: dict[str, Any], filename: str, metadata: dict[str, str] | None = None
        ) -> None:
            path = Path(filename)
            found = _TEMP_OF_ROUND.match(path.parent.name)
            real_save_file(tensors, filename, metadata)
            if found and int(found.group(1)) == at_round and path.name == "model.safetensors":
                _write_half(path, path.read_bytes())
                _hang(marker)

        policy.checkpoint.save_file = save_file  # type: ignore[assignment]
    elif fault == "node_state":
        real_write = node.checkpoints.write_node_state

        def write_node_state(directory: Path, state: dict) -> None:
            if node.checkpoints.round_of(directory) == at_round:
                text = json.dumps(state, sort_keys=True).encode()
                _write_half(directory / f".{node.checkpoints.NODE_STATE}.tmp", text)
                _hang(marker)
            real_write(directory, state)

        node.checkpoints.write_node_state = write_node_state  # type: ignore[assignment]
    else:
        raise SystemExit(f"unknown SWARM_FAULT {fault!r}")


if __name__ == "__main__":
    if "SWARM_FAULT" in os.environ:
        install(
            os.environ["SWARM_FAULT"],
            int(os.environ["SWARM_FAULT_ROUND"]),
            Path(os.environ["SWARM_FAULT_MARKER"]),
        )
    sys.argv[0] = "swarm"
    app()
