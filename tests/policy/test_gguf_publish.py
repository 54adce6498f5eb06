"""Publishing a GGUF conversion: one rename, and a race between two converting processes
(two nodes, or two test workers, on one machine) leaves one complete folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from policy.gguf_import import MODEL_FILES, TOKENIZER_FILES, publish_conversion


def _conversion(folder: Path, names: tuple[str, ...] = (*MODEL_FILES, *TOKENIZER_FILES)) -> Path:
    folder.mkdir()
    for name in names:
        (folder / name).write_text(f"{folder.name}:{name}")
    return folder


def test_a_conversion_is_renamed_into_place(tmp_path: Path) -> None:
    tmp = _conversion(tmp_path / ".out.tmp-1")
    publish_conversion(tmp, tmp_path / "out")
    assert (tmp_path / "out" / "config.json").read_text() == ".out.tmp-1:config.json"
    assert not tmp.exists()


def test_the_first_complete_conversion_stands_and_the_second_is_discarded(
    tmp_path: Path,
) -> None:
    publish_conversion(_conversion(tmp_path / ".out.tmp-1"), tmp_path / "out")
    late = _conversion(tmp_path / ".out.tmp-2")
    publish_conversion(late, tmp_path / "out")
    assert (tmp_path / "out" / "config.json").read_text() == ".out.tmp-1:config.json"
    assert not late.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_incomplete_folder_in_the_way_is_an_error_not_overwritten(tmp_path: Path) -> None:
    _conversion(tmp_path / "out", names=("config.json",))
    with pytest.raises(OSError):
        publish_conversion(_conversion(tmp_path / ".out.tmp-1"), tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["config.json"]
