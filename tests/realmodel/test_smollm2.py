"""A real instruct model end to end (SmolLM2-135M-Instruct, CPU): chat template and
few-shot prompts, EOS bits on the wire, GRPO steps that move weights (bf16 included),
HF-loadable export, LoRA adapters that train and travel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from node.deltas import model_params
from node.policy_learner import PolicyLearner
from policy.export import export_hf
from policy.precision import share_changed
from policy.trainer import TrainGroup
from rewards.tasks import make_task
from swarm.codec import Limits
from swarm.config import NodeConfig, parse_config
from swarm.messages import RolloutBatch, TaskRef, decode_payload, encode_payload

pytestmark = [pytest.mark.slow, pytest.mark.realmodel, pytest.mark.usefixtures("two_threads")]


def _config(model_dir: Path, tmp: Path, **sections: dict) -> NodeConfig:
    base = {
        "node": {"data_dir": str(tmp / "run")},
        "model": {"name_or_path": str(model_dir), "threads": 2, "seed": 0},
        "tasks": {"mixture": [{"source": "add"}]},
        "sampler": {"group_size": 2, "max_new_tokens": 12},
        # No entropy bonus: these tests were written before 0.1 became the default.
        "train": {"learning_rate": 1e-5, "entropy_coef": 0.0},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return parse_config(base)


def _group(learner: PolicyLearner) -> TrainGroup:
    task = make_task(TaskRef("add", 5, 0))
    wrong = str(int(task.answer) + 1)
    return TrainGroup(
        task.prompt,
        [f"<answer>{task.answer}</answer>", f"<answer>{wrong}</answer>"],
        [1.0, 0.0],
        local=False,
        finished=[True, True],
        prompt_ids=learner.renderer.ids(task.prompt, "add"),
    )


@pytest.fixture(scope="module")
def learner(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> PolicyLearner:
    return PolicyLearner(_config(smollm2_dir, tmp_path_factory.mktemp("full")))


def test_chat_template_and_examples_are_applied(learner: PolicyLearner) -> None:
    assert learner.renderer.mode == "chat"
    text = learner.renderer.render("3+4=", "add")
    assert text.startswith("<|im_start|>system\nAnswer with only the final answer")
    assert text.count("<|im_start|>assistant\n<answer>") == 2  # two solved examples
    assert text.endswith("<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n")
    assert learner.rewards_config.answer_format == "answer_block"


def test_real_samples_end_with_eos_and_keep_the_bit_on_the_wire(learner: PolicyLearner) -> None:
    refs = [TaskRef("add", 11, i) for i in range(2)]
    result = learner.sample(refs, seed=1)
    groups = result.groups
    assert all(len(g.completions) == 2 for g in groups)
    finished = [f for g in groups for f in g.finished]
    assert any(finished), [g.completions for g in groups]  # <|im_end|> within 12 tokens
    for g in groups:
        for done, ids in zip(g.finished, g.token_ids or (), strict=True):
            assert done == (ids[-1] in learner.stop_ids)
    batch = RolloutBatch(tuple(g.to_wire(learner.model_id, 0) for g in groups))
    decoded = decode_payload("rollouts", encode_payload(batch), Limits())
    assert [g.finished for g in decoded.groups] == [g.finished for g in groups]
    assert any("<answer>" in c for g in groups for c in g.completions)


def test_a_grpo_step_changes_the_weights(learner: PolicyLearner) -> None:
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    stats = learner.trainer.step([_group(learner)])
    assert stats.n_groups == 1 and stats.policy_version == learner.policy_version
    assert share_changed(before, learner.model) > 0.5


def test_bf16_with_master_weights_moves_weights_that_bf16_alone_rounds_away(
    smollm2_short_dir: Path, tmp_path: Path
) -> None:
    # What a step does to each weight does not depend on depth: the first 4 layers (a bf16
    # step of the whole model takes 40 s on this CPU; bf16 matmuls have no fast kernel).
    shares = {}
    for master in (False, True):
        config = _config(
            smollm2_short_dir,
            tmp_path / str(master),
            model={"dtype": "bfloat16", "master_weights": master},
            train={"learning_rate": 1e-6},
        )
        node = PolicyLearner(config)
        # The decoder layers: the tied embedding moves only in the rows of the batch's
        # tokens (and is 2/3 of the cut model's weights).
        before = {
            k: v.clone()
            for k, v in node.model.state_dict().items()
            if "embed_tokens" not in k and "lm_head" not in k
        }
        assert node.trainer.step([_group(node)]).n_groups == 1
        shares[master] = share_changed(before, node.model)
        del node
    assert shares[True] > 0.5 and shares[False] < 0.5 * shares[True], shares


def test_export_loads_back_bit_identical(learner: PolicyLearner, tmp_path: Path) -> None:
    learner.save(tmp_path / "ckpt", {"rounds_done": 1})
    out = export_hf(tmp_path / "ckpt", tmp_path / "export")
    loaded = AutoModelForCausalLM.from_pretrained(out)
    own = learner.model.state_dict()
    assert all(torch.equal(v, own[k]) for k, v in loaded.state_dict().items())
    assert (out / "chat_template.jinja").is_file() or "chat_template" in (
        out / "tokenizer_config.json"
    ).read_text()


def test_lora_adapters_train_and_travel(smollm2_dir: Path, tmp_path: Path) -> None:
    sections = {
        "model": {"lora": {"enabled": True, "rank": 8}},
        "deltas": {"enabled": True, "every_k_steps": 1, "encoding": "dense_fp16"},
        "train": {"learning_rate": 1e-3},
    }
    a = PolicyLearner(_config(smollm2_dir, tmp_path / "a", **sections))
    b = PolicyLearner(_config(smollm2_dir, tmp_path / "b", **sections))
    assert a.model_family == b.model_family
    adapters = model_params(a.model)
    assert adapters and all("lora_" in k for k in adapters)
    assert sum(t.numel() for t in adapters.values()) < 0.02 * a.model.num_parameters()
    frozen = {k: v.clone() for k, v in a.model.state_dict().items() if "lora_" not in k}
    a.trainer.step([_group(a)])
    assert all(torch.equal(a.model.state_dict()[k], v) for k, v in frozen.items())
    packet, _ = a.share_deltas(own_round=0)
    assert packet is not None
    b.trainer.step([_group(b)])
    before = {k: v.clone() for k, v in model_params(b.model).items()}
    b.receive_delta("peer-a", a.policy_version, packet, arrival_round=0)
    _, stats = b.share_deltas(own_round=0)
    assert stats is not None and stats["applied_norm"] > 0
    assert any(not torch.equal(model_params(b.model)[k], v) for k, v in before.items())
