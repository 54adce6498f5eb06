"""Scenario files are validated like node configs: strict, with the field named."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from simnet.scenario import load_scenario, parse_scenario
from swarm.errors import ConfigError
from tests.simnet.helpers import BASE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def _with(**changes: object) -> dict:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.rglob("*.toml")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_example_scenarios_load(path: Path, request: pytest.FixtureRequest) -> None:
    if ".cache/smollm2-135m-instruct" in path.read_text():
        # a real-model scenario: its model folder must exist to validate (built once)
        request.getfixturevalue("smollm2_dir")
    scenario = load_scenario(path)
    assert scenario.nodes and scenario.rounds > 0


def test_unknown_key_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"network\.lossy: .*unknown key"):
        parse_scenario(_with(network={"lossy": 0.1}), "s.toml")


def test_bad_node_config_override_names_the_node_group() -> None:
    data = copy.deepcopy(BASE)
    data["nodes"][0]["config"] = {"sapo": {"local_groups": -1}}
    with pytest.raises(ConfigError, match=r"nodes 'n'.*sapo\.local_groups"):
        parse_scenario(data, "s.toml")


def test_simnet_owned_fields_cannot_be_overridden() -> None:
    with pytest.raises(ConfigError, match="transport"):
        parse_scenario(_with(defaults={"transport": {"type": "memory"}}), "s.toml")
    with pytest.raises(ConfigError, match=r"tasks\.seed is set by simnet"):
        parse_scenario(_with(defaults={"tasks": {"seed": 3}}), "s.toml")
    with pytest.raises(ConfigError, match=r"eval\.seed is set by simnet"):
        parse_scenario(_with(defaults={"eval": {"seed": 3}}), "s.toml")


def test_eval_sources_can_be_set_per_node_group() -> None:
    data = copy.deepcopy(BASE)
    data["nodes"][0]["config"] = {"eval": {"sources": ["add", "copy"], "num_tasks": 8}}
    scenario = parse_scenario(data, "s.toml")
    assert scenario.nodes[0].config["eval"]["sources"] == ["add", "copy"]
    data["nodes"][0]["config"] = {"eval": {"sources": ["add", "nope"]}}
    with pytest.raises(ConfigError, match=r"eval\.sources.*unknown task source 'nope'"):
        parse_scenario(data, "s.toml")


def test_faults_must_name_known_nodes_and_heal_after_they_start() -> None:
    with pytest.raises(ConfigError, match="unknown node 'x'"):
        parse_scenario(_with(faults=[{"type": "leave", "node": "x", "at_s": 1}]), "s.toml")
    with pytest.raises(ConfigError, match="end_s must be > start_s"):
        parse_scenario(
            _with(faults=[{"type": "partition", "start_s": 5, "end_s": 5, "groups": [["n-0"]]}]),
            "s.toml",
        )
    ok = parse_scenario(
        _with(faults=[{"type": "partition", "start_s": 1, "groups": [["n"]]}]), "s.toml"
    )
    assert ok.group_members("n") == ["n-0", "n-1", "n-2", "n-3"]


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_scenario(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_scenario(bad)


def test_variant_names_are_unique_and_directory_safe() -> None:
    with pytest.raises(ConfigError, match="variant names must be unique"):
        parse_scenario(_with(variants=[{"name": "a"}, {"name": "a"}]), "s.toml")
    with pytest.raises(ConfigError, match=r"variants\.0\.name"):
        parse_scenario(_with(variants=[{"name": "4/4"}]), "s.toml")


def test_warmstart_refuses_settings_that_snapshot_initial_weights() -> None:
    data = _with(
        warmstart={"steps": 5},
        nodes=[{"name": "t", "count": 2, "model": "builtin:tiny"}],
        defaults={"train": {"beta": 0.1}},
    )
    with pytest.raises(ConfigError, match=r"warmstart needs train\.beta = 0"):
        parse_scenario(data, "s.toml")
    data["nodes"][0]["model"] = "stub"  # stub nodes have no weights: fine
    assert parse_scenario(data, "s.toml").warmstart is not None
