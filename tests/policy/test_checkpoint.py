"""Checkpoints: exact restore of model + optimizer, atomic replace, torn ones ignored."""

from __future__ import annotations

import errno
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import SafetensorError

import policy.checkpoint as checkpoint_module
from policy.checkpoint import (
    CheckpointError,
    latest_valid_checkpoint,
    load_checkpoint,
    restore_rng_state,
    rng_state_tensors,
)
from policy.tiny import build_tiny
from policy.trainer import Trainer, TrainGroup
from swarm.config.learning import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def _save(directory: Path, *args: Any, **kwargs: Any) -> None:
    """Capture and write at once, as a foreground checkpoint does."""
    checkpoint_module.write_checkpoint(
        checkpoint_module.capture_checkpoint(directory, *args, **kwargs)
    )


def _trained(seed: int = 0, steps: int = 2) -> Trainer:
    model, tok = build_tiny("builtin:tiny", seed=seed)
    trainer = Trainer(model, tok, TrainConfig(learning_rate=1e-3, weight_decay=0.01), "cpu")
    for i in range(steps):
        trainer.step([_group(tok, i)])
    return trainer


def _group(tok, i: int) -> TrainGroup:  # type: ignore[no-untyped-def]
    texts = ["7", "3", str(i)]
    ids = [tok(t)["input_ids"] + [tok.eos_token_id] for t in texts]
    return TrainGroup("3+4=", texts, [1.0, 0.0, 0.5], ids)


def _assert_same(a: Trainer, b: Trainer) -> None:
    for (ka, va), (kb, vb) in zip(
        a.model.state_dict().items(), b.model.state_dict().items(), strict=True
    ):
        assert ka == kb and torch.equal(va, vb)
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for pid in sa["state"]:
        for key, value in sa["state"][pid].items():
            assert torch.equal(value, sb["state"][pid][key])


def test_save_load_restores_model_and_optimizer_exactly(tmp_path: Path) -> None:
    src = _trained(seed=0)
    extra = {"residual.w": torch.arange(6.0).reshape(2, 3)}
    _save(tmp_path / "step-2", src.model, src.optimizer, extra, {"step": 2, "note": "x"})
    dst = _trained(seed=1, steps=1)  # different weights and optimizer state
    manifest, got_extra = load_checkpoint(tmp_path / "step-2", dst.model, dst.optimizer)
    assert manifest == {"step": 2, "note": "x"}
    assert torch.equal(got_extra["residual.w"], extra["residual.w"])
    _assert_same(src, dst)
    assert isinstance(dst.optimizer.param_groups[0]["betas"], tuple)
    # tied embeddings stay tied after loading
    assert dst.model.lm_head.weight.data_ptr() == dst.model.model.embed_tokens.weight.data_ptr()
    # training on from both gives bit-identical results
    src.step([_group(src.tokenizer, 9)])
    dst.step([_group(dst.tokenizer, 9)])
    _assert_same(src, dst)


def test_replacing_a_checkpoint_and_leaving_no_temporaries(tmp_path: Path) -> None:
    t = _trained()
    target = tmp_path / "latest"
    _save(target, t.model, t.optimizer, {}, {"step": 1})
    t.step([_group(t.tokenizer, 3)])
    _save(target, t.model, t.optimizer, {}, {"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]
    manifest, _ = load_checkpoint(target, _trained(seed=1).model, None)
    assert manifest["step"] == 2


def test_latest_valid_checkpoint_ignores_torn_and_incomplete(tmp_path: Path) -> None:
    t = _trained(steps=1)
    for step in (1, 2, 3, 4):
        _save(tmp_path / f"ckpt-{step}", t.model, t.optimizer, {}, {"step": step})
    assert latest_valid_checkpoint(tmp_path) == tmp_path / "ckpt-4"
    # 4: truncated file (a torn write)
    opt = tmp_path / "ckpt-4" / "optimizer.safetensors"
    opt.write_bytes(opt.read_bytes()[:100])
    # 3: same size, one flipped byte (bit rot / tampering)
    model_file = tmp_path / "ckpt-3" / "model.safetensors"
    data = bytearray(model_file.read_bytes())
    data[-1] ^= 0xFF
    model_file.write_bytes(bytes(data))
    # a temporary directory from a crash mid-save, and a directory without a manifest
    (tmp_path / ".ckpt-9.tmp-1-abc").mkdir()
    (tmp_path / "ckpt-8").mkdir()
    (tmp_path / "ckpt-7").mkdir()
    (tmp_path / "ckpt-7" / "manifest.json").write_text("{not json")
    assert latest_valid_checkpoint(tmp_path) == tmp_path / "ckpt-2"
    with pytest.raises(CheckpointError, match="hash"):
        load_checkpoint(tmp_path / "ckpt-3", t.model, t.optimizer)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path / "ckpt-4", t.model, t.optimizer)
    assert latest_valid_checkpoint(tmp_path / "nowhere") is None


def test_manifest_is_plain_json_and_a_wrong_model_is_refused(tmp_path: Path) -> None:
    t = _trained(steps=1)
    _save(tmp_path / "c", t.model, t.optimizer, {}, {"step": 1})
    doc = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert doc["format"] == "swarm-checkpoint/1" and doc["manifest"] == {"step": 1}
    assert doc["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
    bigger, _ = build_tiny("builtin:tiny-2x")
    with pytest.raises(CheckpointError, match="does not fit"):
        load_checkpoint(tmp_path / "c", bigger, None)


def test_rng_state_round_trip() -> None:
    state = rng_state_tensors()
    expected = (random.random(), torch.rand(2))
    random.random()
    torch.rand(5)
    restore_rng_state(state)
    got = (random.random(), torch.rand(2))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])


def test_a_full_disk_raises_oserror_and_keeps_the_older_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = _trained(steps=1)
    target = tmp_path / "latest"
    _save(target, t.model, t.optimizer, {}, {"step": 1})
    real = checkpoint_module.save_file

    def full_disk(tensors: dict, filename: str, metadata: dict | None = None) -> None:
        real(tensors, filename, metadata)  # part of the data may be there (and must be cleaned up)
        # safetensors 0.8's own words for ENOSPC (tests/node/test_faults.py gets a real
        # EFBIG from it in a process under RLIMIT_FSIZE)
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28)"
        )

    monkeypatch.setattr(checkpoint_module, "save_file", full_disk)
    with pytest.raises(OSError) as info:
        _save(target, t.model, t.optimizer, {}, {"step": 2})
    assert info.value.errno == errno.ENOSPC
    assert str(info.value.filename).endswith("model.safetensors")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest"]  # no temp dir left
    manifest, _ = load_checkpoint(target, _trained(seed=1).model, None)
    assert manifest["step"] == 1

    def not_io(tensors: dict, filename: str, metadata: dict | None = None) -> None:
        raise SafetensorError("invalid tensor")

    monkeypatch.setattr(checkpoint_module, "save_file", not_io)
    with pytest.raises(SafetensorError, match="invalid tensor"):  # a bug stays a bug
        _save(target, t.model, t.optimizer, {}, {"step": 2})


def test_a_captured_checkpoint_holds_the_state_at_capture_not_at_write(tmp_path: Path) -> None:
    """What a background write saves is the state when it was captured: training that
    happens before the write (the next rounds) must not leak into it."""
    trainer = _trained(seed=0)
    at_capture = _trained(seed=0)  # the same two steps: the state to expect
    image = checkpoint_module.capture_checkpoint(
        tmp_path / "step-2", trainer.model, trainer.optimizer, {}, {"step": 2}
    )
    trainer.step([_group(trainer.tokenizer, 7)])  # training goes on before the write
    now, then = trainer.model.state_dict(), at_capture.model.state_dict()
    assert any(not torch.equal(now[k], then[k]) for k in now)  # the model did change
    checkpoint_module.write_checkpoint(image)
    restored = _trained(seed=1, steps=1)
    load_checkpoint(tmp_path / "step-2", restored.model, restored.optimizer)
    _assert_same(restored, at_capture)


def test_capture_writes_no_files_and_the_write_makes_a_model_folder(tmp_path: Path) -> None:
    """A full model's capture is a memory copy only (config and tokenizer files are written
    with the tensors, off the round), and the written checkpoint still loads as a Hugging
    Face folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = _trained(seed=0)
    image = checkpoint_module.capture_checkpoint(
        tmp_path / "step-2", trainer.model, trainer.optimizer, {}, {"step": 2},
        tokenizer=trainer.tokenizer,
    )  # fmt: skip
    assert image.tmp.is_dir() and not any(image.tmp.iterdir())
    checkpoint_module.write_checkpoint(image)
    folder = tmp_path / "step-2"
    assert {"config.json", "generation_config.json", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()
    }
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok("3+4=")["input_ids"] == trainer.tokenizer("3+4=")["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(model.state_dict()[key], value)
