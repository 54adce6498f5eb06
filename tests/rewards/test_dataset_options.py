"""Per-source dataset options: validated at config load, part of the source's name on the
wire, served only by nodes that use the same options (workers included)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from node.rescore import Refused
from node.workers import RescoreWorkers
from rewards import rg
from rewards.mixture import TaskStream, variants
from rewards.tasks import get_source, make_task
from swarm.config import RewardsConfig, parse_config
from swarm.errors import ConfigError
from swarm.messages import RolloutGroup, TaskRef

SAPO_ARITHMETIC = {  # genrl's datasets.yaml for the SAPO paper
    "min_terms": 2,
    "max_terms": 4,
    "min_digits": 1,
    "max_digits": 3,
    "operators": ["+", "-", "*", "/"],
    "allow_parentheses": True,
    "allow_negation": True,
    "format_style": "natural",
    "whitespace": "single",
}


def _tasks(options: dict) -> dict:
    mixture = [{"source": "rg:basic_arithmetic", "options": options}]
    return {"tasks": {"mixture": mixture, "seed": 0}}


def test_options_are_checked_at_config_load() -> None:
    parse_config(_tasks(SAPO_ARITHMETIC))
    with pytest.raises(
        ConfigError, match=r"unknown option\(s\) \['max_termz'\]; allowed: .*max_terms"
    ):
        parse_config(_tasks({"max_termz": 3}))
    with pytest.raises(ConfigError, match="rejected by reasoning-gym"):
        parse_config(_tasks({"min_terms": 5, "max_terms": 2}))
    with pytest.raises(ConfigError, match="takes no options"):
        parse_config({"tasks": {"mixture": [{"source": "add", "options": {"x": 1}}]}})


def test_the_options_are_part_of_the_source_name() -> None:
    a = rg.variant_name("basic_arithmetic", SAPO_ARITHMETIC)
    reordered = dict(reversed(list(SAPO_ARITHMETIC.items())))
    assert a == rg.variant_name("basic_arithmetic", reordered)
    assert re.fullmatch(r"rg:basic_arithmetic@[0-9a-f]{12}", a)
    assert a != rg.variant_name("basic_arithmetic", {**SAPO_ARITHMETIC, "max_digits": 2})
    assert rg.variant_name("basic_arithmetic", {}) == "rg:basic_arithmetic"


def test_a_stream_with_options_generates_with_them() -> None:
    config = parse_config(_tasks({"min_terms": 5, "max_terms": 5, "operators": ["+"]}))
    refs = TaskStream(config.tasks, 0).next_refs(3)
    assert all(r.source.startswith("rg:basic_arithmetic@") for r in refs)
    for ref in refs:
        question = make_task(ref).prompt
        assert question.count("+") >= 4  # five terms, every operator a "+"
        default = make_task(TaskRef("rg:basic_arithmetic", ref.seed, ref.index)).prompt
        assert default != question


def test_an_unregistered_variant_is_unknown_not_regenerated_with_defaults() -> None:
    with pytest.raises(KeyError) as info:
        get_source("rg:basic_arithmetic@000000000000")
    assert getattr(info.value, "reason", None) == "unknown_task"


def test_workers_serve_the_nodes_variants() -> None:
    options = {"min_terms": 3, "max_terms": 3, "operators": ["*"]}
    config = parse_config(_tasks(options))
    [ref] = TaskStream(config.tasks, 1).next_refs(1)
    task = make_task(ref)
    group = RolloutGroup(
        ref,
        task.prompt,
        (f"<answer>{task.answer}</answer>", "<answer>x</answer>"),
        (1.0, 0.0),
        "m",
        0,
        (True, True),
    )

    async def go(found: tuple) -> object:
        correctness = RewardsConfig(format_weight=0.0)  # the rewards below: correctness alone
        workers = RescoreWorkers(correctness, workers=1, timeout_s=120.0, variants=found)
        await workers.start()
        try:
            return await workers.rescore(group)
        except Refused as refused:
            return refused.reason
        finally:
            await workers.close()

    rescored = asyncio.run(go(variants(config.tasks)))
    assert rescored.rewards == (1.0, 0.0)  # type: ignore[union-attr]
    assert asyncio.run(go(())) == "unknown_task"  # a worker without the variant refuses


def test_options_round_trip_through_the_commented_template(tmp_path: Path) -> None:
    from swarm.config import load_config
    from swarm.config.template import render_config

    config = parse_config(_tasks(SAPO_ARITHMETIC))
    path = tmp_path / "node.toml"
    path.write_text(render_config(config))
    assert load_config(path).tasks.mixture[0].options == SAPO_ARITHMETIC
