"""How many cores one test process may use while pytest-xdist workers share the machine."""

from __future__ import annotations

import os


def cores_per_worker() -> int:
    """All the cores, shared evenly among the xdist workers (one worker: all of them)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // max(workers, 1))
