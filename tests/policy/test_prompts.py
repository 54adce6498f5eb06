"""Prompt rendering: plain vs chat template, shared by sampler and trainer."""

from __future__ import annotations

import pytest

from policy.prompts import PromptRenderer, resolve_mode
from policy.sampler import SamplingParams, TransformersSampler, encode_prompt
from policy.tiny import build_tiny
from policy.trainer import StepStats, Trainer, TrainGroup
from swarm.config.learning import PromptConfig, TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")

# A chat template in the tiny model's alphabet: "s:<system>\nu:<user>\na:"
TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def _chat_tiny() -> tuple[object, object]:
    model, tok = build_tiny("builtin:tiny")
    tok.chat_template = TEMPLATE
    return model, tok


def test_plain_mode_is_the_question_with_special_tokens() -> None:
    _, tok = build_tiny("builtin:tiny")
    renderer = PromptRenderer(tok, PromptConfig())  # auto, no template -> plain
    assert renderer.mode == "plain"
    assert renderer.render("3+4=") == "3+4="
    assert renderer.ids("3+4=") == encode_prompt(tok, "3+4=")


def test_chat_needs_a_template_and_says_how_to_fix_it() -> None:
    _, tok = build_tiny("builtin:tiny")
    with pytest.raises(ValueError, match="template = 'plain'"):
        resolve_mode(PromptConfig(template="chat"), tok)


def test_chat_mode_applies_the_template_with_the_system_prompt() -> None:
    _, tok = _chat_tiny()
    renderer = PromptRenderer(tok, PromptConfig(system_prompt="answer briefly"))
    assert renderer.mode == "chat"
    text = renderer.render("3+4=")
    assert text == "s:answer briefly\nu:3+4=\na:"
    assert renderer.ids("3+4=") == list(tok(text, add_special_tokens=False)["input_ids"])
    no_system = PromptRenderer(tok, PromptConfig(system_prompt=""))
    assert no_system.render("3+4=") == "u:3+4=\na:"
    plain = PromptRenderer(tok, PromptConfig(template="plain"))
    assert plain.render("3+4=") == "3+4="


def test_sampler_and_trainer_see_the_same_rendered_prompt() -> None:
    model, tok = _chat_tiny()
    renderer = PromptRenderer(tok, PromptConfig(system_prompt="be brief"))
    sampler = TransformersSampler(model, tok, seed=1, renderer=renderer)
    trainer = Trainer(model, tok, TrainConfig(), "cpu", renderer=renderer)
    [[completion, *_]] = sampler.generate(["3+4="], 2, SamplingParams(max_new_tokens=3))
    group = TrainGroup(
        "3+4=", [completion.text, "x"], [1.0, 0.0], [completion.token_ids, [5]], local=True
    )
    rows = trainer._rows(group, StepStats())
    assert rows[0].ids[: rows[0].start] == renderer.ids("3+4=")
    assert rows[0].ids[rows[0].start :] == completion.token_ids


def test_chat_mode_puts_solved_examples_of_the_source_first() -> None:
    _, tok = _chat_tiny()
    shots = {"add": [("1+1=", "2"), ("2+2=", "4"), ("3+3=", "6")]}
    renderer = PromptRenderer(
        tok, PromptConfig(system_prompt="x", few_shot=2), lambda source: shots[source]
    )
    text = renderer.render("3+4=", "add")
    assert text == ("s:x\nu:1+1=\na:<answer>2</answer>\nu:2+2=\na:<answer>4</answer>\nu:3+4=\na:")
    assert renderer.render("3+4=") == "s:x\nu:3+4=\na:"  # no source: no examples
    assert renderer.ids("3+4=", "add") == list(tok(text, add_special_tokens=False)["input_ids"])
    plain = PromptRenderer(tok, PromptConfig(template="plain"), lambda source: shots[source])
    assert plain.render("3+4=", "add") == "3+4="


def test_solved_examples_are_fixed_and_apart_from_task_streams() -> None:
    from rewards.tasks import EXAMPLE_SEED, make_task, solved_examples
    from swarm.messages import TaskRef

    examples = solved_examples("add")
    assert examples == solved_examples("add") and len(examples) == 8
    assert examples[0] == (
        make_task(TaskRef("add", EXAMPLE_SEED, 0)).prompt,
        make_task(TaskRef("add", EXAMPLE_SEED, 0)).answer,
    )
