"""The per-round progress line as users see it in a terminal and in a log file."""

from __future__ import annotations

import io

from rich.console import Console

from node.progress import print_round


def _record() -> dict:
    return {
        "round": 1234,
        "policy_version": 1200,
        "mean_local_reward": 0.5,
        "external_groups": 4,
        "external_by_sender": {"a": 2, "b": 2},
        "peers": 12,
        "pool_groups": 96,
        "seconds": {"total": 12.5},
    }


def test_a_round_is_one_line_in_a_narrow_log_file() -> None:
    """Piped to a file, rich assumes 80 columns: the line must not be folded in two (it
    was: every round's time landed on a line of its own)."""
    out = io.StringIO()
    print_round(
        Console(file=out, width=60, force_terminal=False), "node-with-a-long-name", _record()
    )
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("node-with-a-long-name round 1234  v1200")
    assert lines[0].endswith("pool 96  12.50s")
