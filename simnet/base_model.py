"""A shared "base model" for real-model nodes: a short supervised warm start.

SAPO's nodes start from one pretrained model; the built-in tiny model starts from random
weights and, from scratch, gets almost no reward on the built-in tasks, so GRPO has no
signal. A scenario's `[warmstart]` gives every node of a model the same base instead:
`policy.warmstart.supervised_warmup` on task pairs (true answers: a base that knows a
little; shuffled answers: one that knows only the output format), run once per (model,
run seed, spec) and cached in this process.

Invariants:
- Deterministic: the base's initial weights come from `derive(seed, "base", model)`, the
  pairs from a task stream seeded the same way, and warm-up draws no other randomness.
- `apply_base` loads the base into a freshly built `PolicyLearner` and hands the sampler
  the new weights, before the node trains or resumes (a resume then overwrites them).
  It requires `train.beta == 0` and deltas off, because the trainer's reference copy
  and the delta exchange snapshot the initial weights at construction (the scenario
  refuses other combinations at load). It also renames the learner's `model_family`
  after the base, so nodes of one base are of one family (peers' sampler logprobs are
  used only within a family, `train.peer_offpolicy`).
- torch is imported only here (and only for real-model scenarios).
"""

from __future__ import annotations

from typing import Any

import torch

from policy.loading import load_policy_model, model_family
from policy.warmstart import supervised_warmup
from rewards.mixture import TaskStream
from rewards.tasks import make_task
from simnet.scenario import WarmStartSpec
from swarm.config import ModelConfig, TasksConfig

_CACHE: dict[tuple[str, int, str], dict[str, torch.Tensor]] = {}


def base_state(model: str, seed: int, spec: WarmStartSpec) -> dict[str, torch.Tensor]:
    """The warmed-up state dict of `model` for init seed `seed` (cached per process)."""
    key = (model, seed, spec.model_dump_json())
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    net, tokenizer = load_policy_model(ModelConfig(name_or_path=model, device="cpu", seed=seed))
    stream = TaskStream(TasksConfig(mixture=spec.tasks, seed=seed), node_seed=0)

    def pairs(step: int) -> list[tuple[str, str]]:
        tasks = [make_task(ref) for ref in stream.next_refs(spec.batch)]
        if spec.answers == "true":
            return [(t.prompt, t.answer) for t in tasks]
        others = [make_task(ref).answer for ref in stream.next_refs(spec.batch)]
        return [(t.prompt, a) for t, a in zip(tasks, others, strict=True)]

    supervised_warmup(net, tokenizer, pairs, spec.steps, spec.lr)
    state = {name: tensor.detach().clone() for name, tensor in net.state_dict().items()}
    _CACHE[key] = state
    return state


def apply_base(learner: Any, state: dict[str, torch.Tensor]) -> None:
    """Load `state` into a freshly built `node.policy_learner.PolicyLearner`, and name
    its model family after that base (every node of one base is then of one family, as
    nodes loading one pretrained checkpoint are; the family hashed at construction was
    of the node's own random init)."""
    learner.model.load_state_dict(state)
    learner.model_family = model_family(learner.model)
    learner.sampler.update_weights(learner.trainer.state_dict_for_sampler())
