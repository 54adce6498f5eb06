"""This node's proof of work on its key, minted once and kept in its data directory.

Invariants:
- `<data_dir>/identity-work.json` holds `swarm_id`, `peer_id`, `bits` and `nonce`; it is
  used only when its swarm and key are this node's and its nonce has at least the bits
  asked for now (checked, not trusted); otherwise a new nonce is minted and the file
  replaced atomically (a mint interrupted by Ctrl-C leaves the old file as it was).
- Minting logs its progress about every 10 s of work, with the expected total.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from swarm.identity_work import has_work, mint

log = logging.getLogger("swarm.node")

WORK_FILE = "identity-work.json"
_LOG_EVERY_S = 10.0


def identity_work_nonce(data_dir: Path, swarm_id: str, peer_id: str, bits: int) -> int:
    """A nonce with `bits` bits of work on `peer_id` for `swarm_id`: the stored one if it
    holds, else a new one (minted here, blocking; seconds to minutes: run it off the loop)."""
    path = data_dir / WORK_FILE
    stored = _read(path)
    if (
        stored is not None
        and stored.get("swarm_id") == swarm_id
        and stored.get("peer_id") == peer_id
        and has_work(swarm_id, peer_id, stored.get("nonce"), bits)
    ):
        return int(stored["nonce"])
    started = time.monotonic()
    last_log = [started]
    log.info("minting proof of work on this node's key for swarm %s: %d bits, ~%d hashes "
             "on average (once per key; kept in %s)", swarm_id, bits, 2**bits, path)  # fmt: skip

    def progress(hashes: int) -> None:
        now = time.monotonic()
        if now - last_log[0] >= _LOG_EVERY_S:
            last_log[0] = now
            rate = hashes / (now - started)
            log.info("proof of work: %d hashes so far (%.0f/s; %.0f%% of the average)",
                     hashes, rate, 100.0 * hashes / 2**bits)  # fmt: skip

    nonce = mint(swarm_id, peer_id, bits, on_progress=progress)
    log.info("proof of work minted in %.1f s (%d hashes)", time.monotonic() - started,
             nonce + 1)  # fmt: skip
    _write(path, {"swarm_id": swarm_id, "peer_id": peer_id, "bits": bits, "nonce": nonce})
    return nonce


def _read(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s (%s): minting again", path, exc)
        return None
    return data if isinstance(data, dict) else None


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data) + "\n")
    os.replace(partial, path)
