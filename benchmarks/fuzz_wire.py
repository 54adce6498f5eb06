"""The long fuzz run of every decoder a peer can reach (outside CI); the harness and its
documentation are `tests/swarm/fuzz_wire.py`, whose short run is a test.

    .venv/bin/python -m benchmarks.fuzz_wire [--inputs 100000] [--seed 0] [--only NAME,...]
        [--out DIR] [--seconds S] [--time-limit S] [--skip-known]
    .venv/bin/python -m benchmarks.fuzz_wire --only envelope --replay DIR/envelope-s0-0000123.bin
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.swarm.fuzz_wire import main

if __name__ == "__main__":
    sys.exit(main())
