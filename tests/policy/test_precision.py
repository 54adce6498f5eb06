"""Training numerics: master weights, autocast, learning-rate schedule, threads."""

from __future__ import annotations

import itertools

import pytest
import torch

from policy.loading import load_policy_model
from policy.precision import configure_threads, lr_factor, parameter_dtype, share_changed
from policy.trainer import Trainer, TrainGroup
from swarm.config.learning import ModelConfig, SamplerConfig, TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")


def test_schedule_is_warmup_then_decay_to_the_floor() -> None:
    cfg = TrainConfig(warmup_steps=4, lr_schedule="cosine", schedule_steps=14, min_lr_ratio=0.2)
    factors = [lr_factor(step, cfg) for step in range(20)]
    assert factors[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert factors[4] == pytest.approx(1.0)
    assert factors[9] == pytest.approx(0.2 + 0.8 * 0.5)  # half way: cosine midpoint
    assert factors[14:] == pytest.approx([0.2] * 6)
    assert all(a >= b for a, b in itertools.pairwise(factors[3:]))
    assert lr_factor(100, TrainConfig()) == 1.0


def test_parameter_dtype_keeps_fp32_master_weights() -> None:
    assert parameter_dtype(ModelConfig(dtype="bfloat16")) == torch.float32
    assert parameter_dtype(ModelConfig(dtype="bfloat16", master_weights=False)) == torch.bfloat16


def _share_changed(master_weights: bool) -> float:
    config = ModelConfig(dtype="bfloat16", master_weights=master_weights, device="cpu", seed=0)
    model, tok = load_policy_model(config)
    trainer = Trainer(
        model,
        tok,
        TrainConfig(learning_rate=1e-5),
        "cpu",
        SamplerConfig(max_new_tokens=4),
        compute_dtype=torch.bfloat16,
    )
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    eos = tok.eos_token_id
    group = TrainGroup(
        "3+4=",
        ["7", "3"],
        [1.0, 0.0],
        [[tok.convert_tokens_to_ids("7"), eos], [tok.convert_tokens_to_ids("3"), eos]],
    )
    assert trainer.step([group]).n_groups == 1
    return share_changed(before, model)


def test_bf16_with_master_weights_really_updates() -> None:
    """At lr 1e-5, bf16 parameters round most Adam updates away; fp32 masters keep them."""
    assert _share_changed(master_weights=True) > 0.5
    assert _share_changed(master_weights=False) < 0.5 * _share_changed(master_weights=True)


def test_threads_are_set_from_config() -> None:
    assert configure_threads(1) == 1 and torch.get_num_threads() == 1
    assert configure_threads(0, small_model=True) == 1
    torch.set_num_threads(2)
    assert configure_threads(0) == 2  # torch's own setting is left alone


def test_gradient_checkpointing_gives_the_same_step() -> None:
    results = []
    for checkpointing in (False, True):
        config = ModelConfig(device="cpu", gradient_checkpointing=checkpointing, seed=0)
        model, tok = load_policy_model(config)
        trainer = Trainer(model, tok, TrainConfig(learning_rate=1e-3), "cpu")
        eos = tok.eos_token_id
        ids = [[tok.convert_tokens_to_ids(c), eos] for c in "73"]
        stats = trainer.step([TrainGroup("3+4=", ["7", "3"], [1.0, 0.0], ids)])
        assert model.is_gradient_checkpointing == checkpointing
        results.append((stats.loss, stats.grad_norm))
    assert results[0][0] == pytest.approx(results[1][0], rel=1e-5)
    assert results[0][1] == pytest.approx(results[1][1], rel=1e-4)
