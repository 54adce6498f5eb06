"""LoRA through PEFT: only adapters train, families name the adapter shape, adapters
exchange as deltas, and checkpoints export merged."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from node.deltas import model_params
from node.policy_learner import PolicyLearner
from policy.export import export_hf
from policy.lora import merge_lora_tensors
from policy.trainer import StepStats, TrainGroup
from swarm.config import parse_config
from swarm.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_thread")

LORA = {"enabled": True, "rank": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj"]}


def _learner(tmp_path: Path, seed: int = 0, beta: float = 0.0, **lora: object) -> PolicyLearner:
    return PolicyLearner(
        parse_config(
            {
                "node": {"data_dir": str(tmp_path / f"run-{seed}")},
                "model": {"seed": seed, "lora": {**LORA, **lora}},
                "sampler": {"group_size": 2, "max_new_tokens": 2},
                "train": {"learning_rate": 1e-2, "beta": beta},
            }
        )
    )


def _step(learner: PolicyLearner) -> StepStats:
    return learner.trainer.step(
        [TrainGroup("3=", ["3", "x"], [1.0, 0.0], local=False, finished=[True] * 2)]
    )


def test_only_the_adapters_train(tmp_path: Path) -> None:
    learner = _learner(tmp_path)
    trainable = model_params(learner.model)
    assert trainable and all("lora_" in name for name in trainable)
    frozen = {k: v.clone() for k, v in learner.model.state_dict().items() if "lora_" not in k}
    before = {k: v.clone() for k, v in trainable.items()}
    _step(learner)
    after = learner.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in frozen.items())
    assert any(not torch.equal(model_params(learner.model)[k], v) for k, v in before.items())


def test_family_names_base_and_adapter_shape(tmp_path: Path) -> None:
    a = _learner(tmp_path, seed=1)
    torch.rand(100)  # whatever the global RNG did meanwhile
    b = _learner(tmp_path, seed=1)
    assert a.model_family != _learner(tmp_path, seed=1, rank=8).model_family
    assert a.model_family != _learner(tmp_path, seed=1, alpha=4.0).model_family
    assert a.model_family != _learner(tmp_path, seed=2).model_family  # another base
    # Same base, same adapter shape: the same family, and identical initial adapters
    # (initialized from a fixed seed, not the node's RNG).
    assert a.model_family == b.model_family
    pa, pb = model_params(a.model), model_params(b.model)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)
    full = PolicyLearner(
        parse_config({"node": {"data_dir": str(tmp_path / "full")}, "model": {"seed": 0}})
    )
    assert full.model_family != a.model_family


def test_lora_with_vllm_is_refused_at_config_load() -> None:
    with pytest.raises(ConfigError, match="not supported yet"):
        parse_config({"model": {"lora": LORA}, "sampler": {"backend": "vllm"}})


def test_merge_is_w_plus_scaled_b_a() -> None:
    w, a, b = torch.randn(3, 4), torch.randn(2, 4), torch.randn(3, 2)
    state = {
        "base_model.model.layer.q_proj.base_layer.weight": w,
        "base_model.model.layer.q_proj.lora_A.default.weight": a,
        "base_model.model.layer.q_proj.lora_B.default.weight": b,
        "base_model.model.embed.weight": torch.ones(2),
    }
    merged = merge_lora_tensors(state, 0.5)
    assert set(merged) == {"layer.q_proj.weight", "embed.weight"}
    assert torch.allclose(merged["layer.q_proj.weight"], w + 0.5 * b @ a)
    del state["base_model.model.layer.q_proj.lora_B.default.weight"]
    with pytest.raises(ValueError, match="incomplete"):
        merge_lora_tensors(state, 0.5)


def test_lora_checkpoint_exports_merged_and_equal_in_outputs(tmp_path: Path) -> None:
    learner = _learner(tmp_path)
    for _ in range(3):
        _step(learner)
    ckpt = tmp_path / "ckpt"
    learner.save(ckpt, {"rounds_done": 1})
    assert (ckpt / "adapter" / "adapter_config.json").is_file()
    assert (ckpt / "lora.json").is_file() and not (ckpt / "config.json").exists()
    out = export_hf(ckpt, tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.tensor([learner.tokenizer("3=")["input_ids"]])
    learner.model.eval()
    with torch.no_grad():
        want = learner.model(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    assert torch.allclose(want, got, atol=1e-5)
    # Resume: a fresh LoRA learner loads the checkpoint exactly.
    other = _learner(tmp_path, seed=3)
    other.load(ckpt)
    assert all(
        torch.equal(other.model.state_dict()[k], v) for k, v in learner.model.state_dict().items()
    )


def test_lora_nodes_exchange_adapter_deltas_only(tmp_path: Path) -> None:
    deltas = {"enabled": True, "every_k_steps": 1, "encoding": "dense_fp16"}

    def node(name: str) -> PolicyLearner:
        return PolicyLearner(
            parse_config(
                {
                    "node": {"data_dir": str(tmp_path / name)},
                    "model": {"lora": LORA, "seed": 0},  # one base: one family
                    "sampler": {"group_size": 2, "max_new_tokens": 2},
                    "train": {"learning_rate": 1e-2},
                    "deltas": deltas,
                }
            )
        )

    sender, receiver = node("a"), node("b")
    _step(sender)
    packet, _ = sender.share_deltas(own_round=0)
    assert packet is not None and packet.model_family == sender.model_family
    names = set(model_params(sender.model))
    assert names and all("lora_" in n for n in names)
    base_before = {k: v.clone() for k, v in receiver.model.state_dict().items() if "lora_" not in k}
    adapters_before = {k: v.clone() for k, v in model_params(receiver.model).items()}
    _step(receiver)  # the receiver trains too: a merge happens at its next K boundary
    receiver.receive_delta("peer-a", sender.policy_version, packet, arrival_round=0)
    _, stats = receiver.share_deltas(own_round=0)
    assert stats is not None and stats["applied_norm"] > 0
    after = receiver.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base_before.items())
    assert any(
        not torch.equal(model_params(receiver.model)[k], v) for k, v in adapters_before.items()
    )
    assert len(packet.tensors) < 64 * 1024  # adapters of a 1M-parameter model: kilobytes


def test_the_kl_reference_of_lora_is_the_base_without_a_copy(tmp_path: Path) -> None:
    """beta > 0 with LoRA: the reference is the model with its adapters off, no frozen
    copy of the weights; every step's loss and KL equal those of the copy it replaced
    (a copy of the model with zero adapters, as the trainer made before)."""
    base_run, copy_run = (_learner(tmp_path / name, beta=0.1) for name in ("base", "copy"))
    assert base_run.trainer.reference.copy is None and base_run.trainer.reference.is_base
    reference = copy_run.trainer.reference
    reference.copy = copy.deepcopy(copy_run.model).eval().requires_grad_(False)
    reference.is_base = False
    kls = []
    for _ in range(3):
        a, b = _step(base_run), _step(copy_run)
        assert a.loss == pytest.approx(b.loss, rel=1e-6, abs=1e-9)
        assert a.kl == pytest.approx(b.kl, rel=1e-6, abs=1e-12)
        kls.append(a.kl)
    assert kls[0] == 0.0 and kls[-1] > 0.0, kls  # zero adapters first: the base itself
