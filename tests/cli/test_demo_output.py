"""`swarm demo --out X` deletes X only if a demo wrote it (or with --force): found by
hand (issue 34), `--out .` wiped the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from node.demo import DEMO_MARKER, clear_output
from swarm.errors import ConfigError


def test_a_folder_a_demo_did_not_write_is_refused_and_kept(tmp_path: Path) -> None:
    precious = tmp_path / "work"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years")
    result = CliRunner().invoke(app, ["demo", "--out", str(precious), "--rounds", "1"])
    assert result.exit_code == 2
    assert "was not written by a demo" in result.output and "--force" in result.output
    assert (precious / "thesis.tex").read_text() == "years"


def test_a_previous_demo_an_empty_folder_or_force_may_be_replaced(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    clear_output(out, force=False)  # new
    assert (out / DEMO_MARKER).is_file()
    (out / "node-0").mkdir()
    clear_output(out, force=False)  # a previous demo's: replaced
    assert not (out / "node-0").exists() and (out / DEMO_MARKER).is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    clear_output(empty, force=False)
    other = tmp_path / "other"
    other.mkdir()
    (other / "x").write_text("x")
    with pytest.raises(ConfigError):
        clear_output(other, force=False)
    clear_output(other, force=True)
    assert not (other / "x").exists()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        clear_output(a_file, force=True)
