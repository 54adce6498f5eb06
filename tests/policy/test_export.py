"""Checkpoints a user can take away: each checkpoint is a Hugging Face folder, and
`swarm export` writes one without optimizer state, bit-identical or cast."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import tomli_w
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from cli.main import app
from node.policy_learner import PolicyLearner
from policy.checkpoint import load_checkpoint
from policy.export import export_hf, exported_dtype
from policy.loading import load_tokenizer
from policy.trainer import TrainGroup
from swarm.config import parse_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _trained_learner(tmp_path: Path, **node: object) -> PolicyLearner:
    config = parse_config(
        {
            "node": {"data_dir": str(tmp_path / "run"), **node},
            "model": {"seed": 0},
            "sampler": {"group_size": 4, "max_new_tokens": 3},
            "train": {"learning_rate": 1e-2},
            "tasks": {"mixture": [{"source": "digit"}]},
            "rewards": {"format_weight": 0.5},
        }
    )
    learner = PolicyLearner(config)
    for _ in range(2):
        learner.trainer.step(
            [TrainGroup("3=", ["3", "x"], [1.0, 0.0], local=False, finished=[True] * 2)]
        )
    assert learner.policy_version == 2
    return learner


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_checkpoint_is_a_hugging_face_folder(tmp_path: Path) -> None:
    learner = _trained_learner(tmp_path)
    ckpt = tmp_path / "ckpt"
    learner.save(ckpt, {"rounds_done": 3})
    loaded = AutoModelForCausalLM.from_pretrained(ckpt)
    assert _same_weights(loaded, learner.model)
    tok = load_tokenizer(str(ckpt))
    assert tok("7=")["input_ids"] == learner.tokenizer("7=")["input_ids"]


def test_export_is_bit_identical_and_loads_back(tmp_path: Path) -> None:
    learner = _trained_learner(tmp_path)
    ckpt = tmp_path / "ckpt"
    learner.save(ckpt, {"rounds_done": 3})
    out = export_hf(ckpt, tmp_path / "export")
    names = sorted(p.name for p in out.iterdir())
    assert "optimizer.safetensors" not in names and "manifest.json" not in names
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    assert _same_weights(AutoModelForCausalLM.from_pretrained(out), learner.model)
    with pytest.raises(FileExistsError):
        export_hf(ckpt, out)
    half = export_hf(ckpt, tmp_path / "bf16", dtype="bfloat16")
    assert exported_dtype(half) == torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(half)
    assert model.config.dtype == torch.bfloat16


def test_swarm_export_takes_the_newest_checkpoint_of_a_run(tmp_path: Path) -> None:
    runner = CliRunner()
    config = tmp_path / "node.toml"
    assert (
        runner.invoke(app, ["init", str(config), "--data-dir", str(tmp_path / "run")]).exit_code
        == 0
    )
    settings = tomllib.loads(config.read_text())
    settings["node"]["checkpoint_every"] = 1  # rounds 2 and 3 kept
    config.write_text(tomli_w.dumps(settings))
    trained = runner.invoke(app, ["train", "--config", str(config), "--rounds", "3"])
    assert trained.exit_code == 0, trained.output
    result = runner.invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "round-00000003" in result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert model.num_parameters() > 0
    again = runner.invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "out")])
    assert again.exit_code == 2 and "--force" in again.output
    empty = runner.invoke(app, ["export", str(tmp_path), str(tmp_path / "x")])
    assert empty.exit_code == 2 and "no valid checkpoint" in empty.output
    # The newest checkpoint's weights corrupted in place (same size): the one before.
    weights = tmp_path / "run" / "checkpoints" / "round-00000003" / "model.safetensors"
    with weights.open("r+b") as f:
        f.seek(weights.stat().st_size // 2)
        f.write(b"\xff" * 16)
    older = runner.invoke(app, ["export", str(tmp_path / "run"), str(tmp_path / "older")])
    assert older.exit_code == 0, older.output
    assert "does not match its hash" in older.output and "round-00000002" in older.output


def test_checkpoints_without_optimizer_state_resume_with_a_fresh_optimizer(
    tmp_path: Path,
) -> None:
    learner = _trained_learner(tmp_path, checkpoint_optimizer=False)
    ckpt = tmp_path / "ckpt"
    learner.save(ckpt, {"rounds_done": 3})
    assert (ckpt / "optimizer.safetensors").stat().st_size < 1024
    fresh = _trained_learner(tmp_path / "other")
    load_checkpoint(ckpt, fresh.model, fresh.trainer.optimizer)
    assert _same_weights(fresh.model, learner.model)
