"""Config: errors name the file and field; every checked-in example loads."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from swarm.config import (
    GossipConfig,
    Libp2pTransportConfig,
    MemoryTransportConfig,
    MqttTransportConfig,
    NodeConfig,
    load_config,
    parse_config,
)
from swarm.errors import ConfigError
from swarm.identity import Identity

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def error_of(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "node.toml")
    return str(info.value)


def test_defaults_are_valid() -> None:
    config = parse_config({})
    assert isinstance(config, NodeConfig)
    assert isinstance(config.transport, Libp2pTransportConfig)
    assert config.gossip == GossipConfig()


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("libp2p", Libp2pTransportConfig),
        ("mqtt", MqttTransportConfig),
        ("memory", MemoryTransportConfig),
    ],
)
def test_transport_union_by_type(kind: str, cls: type) -> None:
    assert isinstance(parse_config({"transport": {"type": kind}}).transport, cls)


def test_bad_value_names_field() -> None:
    message = error_of({"gossip": {"rate_burst": 0}})
    assert "node.toml" in message
    assert "gossip.rate_burst" in message


def test_unknown_key_names_field() -> None:
    message = error_of({"gossip": {"rate_brust": 5}})
    assert "gossip.rate_brust" in message
    assert "unknown key" in message


def test_unknown_section_names_it() -> None:
    assert "gosip" in error_of({"gosip": {}})


def test_unknown_transport_type_lists_choices() -> None:
    message = error_of({"transport": {"type": "carrier-pigeon"}})
    assert "transport" in message
    assert "libp2p" in message and "mqtt" in message and "memory" in message


def test_key_of_other_transport_type_refused() -> None:
    message = error_of({"transport": {"type": "mqtt", "bootstrap": []}})
    assert "bootstrap" in message


def test_bootstrap_without_peer_id_refused() -> None:
    message = error_of({"transport": {"type": "libp2p", "bootstrap": ["/ip4/1.2.3.4/tcp/4001"]}})
    assert "/p2p/" in message


@pytest.mark.parametrize(
    "peer",
    [
        "12D3KooWnotapeerid",  # typed by hand
        "12D3KooWSfTbWvXDWkb3HMgTCmVrRtF8ZF4FJ8fJie2AXv69z9w",  # the last character lost
        "12D3KooWSfTbWvXDWkb3HMgTCmVrRtF8ZF4FJ8fJie2AXv69z9wS0",  # a 0 is not base58
        "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5",  # a sha2-256 id cut short
    ],
)
def test_bootstrap_with_a_broken_peer_id_names_it(peer: str) -> None:
    addr = f"/ip4/1.2.3.4/tcp/4001/p2p/{peer}"
    message = error_of({"transport": {"type": "libp2p", "bootstrap": [addr]}})
    assert "transport.libp2p.bootstrap" in message and f"{peer!r} is not a peer id" in message


def test_bootstrap_peer_ids_of_any_key_type_and_through_relays_are_accepted() -> None:
    ed25519 = Identity.generate().peer_id
    hashed = "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N"  # an RSA key's (sha2-256) id
    relayed = f"/ip4/1.2.3.4/tcp/4001/p2p/{hashed}/p2p-circuit/p2p/{ed25519}"
    addrs = [f"/ip4/1.2.3.4/tcp/4001/p2p/{ed25519}", relayed]
    config = parse_config({"transport": {"type": "libp2p", "bootstrap": addrs}})
    assert config.transport.bootstrap == addrs
    broken = relayed.replace(ed25519, ed25519[:-3])
    message = error_of({"transport": {"type": "libp2p", "bootstrap": [broken]}})
    assert f"{ed25519[:-3]!r} is not a peer id" in message


@pytest.mark.parametrize(
    ("listen", "says"),
    [
        ("/ip4/999.1.1.1/tcp/4001", "'999.1.1.1' is not an IPv4 address"),
        ("/ip4/127.0.0.1/tcp/99999", "'99999' is not a port"),
        ("/ip6/127.0.0.1/tcp/4001", "'127.0.0.1' is not an IPv6 address"),
        ("/ip4/127.0.0.1/udp/4001", "listens on TCP"),
        ("/ip4/127.0.0.1", "listens on TCP"),
    ],
)
def test_a_mistyped_listen_address_names_the_part(listen: str, says: str) -> None:
    message = error_of({"transport": {"type": "libp2p", "listen": listen}})
    assert "transport.libp2p.listen" in message and says in message


def test_a_bootstrap_address_with_a_bad_ip_or_port_names_it() -> None:
    peer = Identity.generate().peer_id
    for addr, says in [
        (f"/ip4/10.0.0/tcp/4001/p2p/{peer}", "'10.0.0' is not an IPv4"),
        (f"/ip4/10.0.0.1/tcp/port/p2p/{peer}", "'port' is not a port"),
    ]:
        message = error_of({"transport": {"type": "libp2p", "bootstrap": [addr]}})
        assert "transport.libp2p.bootstrap" in message and says in message
    addrs = [f"/ip6/::1/tcp/4001/p2p/{peer}", f"/dns4/example.org/tcp/4001/p2p/{peer}"]
    config = parse_config({"transport": {"type": "libp2p", "bootstrap": addrs}})
    assert config.transport.bootstrap == addrs


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("mqtt://broker.example.org", "write the host alone, 'broker.example.org'; the port"),
        ("mqtts://broker.example.org:8883/", "the port goes in transport.port (and TLS"),
        ("broker.example.org:1883", "'broker.example.org', and 1883 in transport.port"),
        ("", "is not a host name"),
        ("bad host", "is not a host name"),
    ],
)
def test_a_broker_host_with_a_url_or_port_says_what_to_write(host: str, says: str) -> None:
    message = error_of({"transport": {"type": "mqtt", "host": host}})
    assert "transport.mqtt.host" in message and says in message


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "mqtt.example.org", "a-b.c_d."])
def test_broker_host_names_and_addresses_are_accepted(host: str) -> None:
    assert parse_config({"transport": {"type": "mqtt", "host": host}}).transport.host == host


def test_bad_swarm_id_refused() -> None:
    assert "node.swarm_id" in error_of({"node": {"swarm_id": "has spaces"}})


def test_wrong_type_names_field() -> None:
    assert "sapo.max_staleness" in error_of({"sapo": {"max_staleness": "two"}})


def test_load_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml")


def test_load_bad_toml_names_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[gossip\nrate_burst = ")
    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(path)
    assert str(path) in str(info.value)


def test_load_bad_field_names_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text("[gossip]\nrate_limit_per_s = -1\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(path) in str(info.value)
    assert "gossip.rate_limit_per_s" in str(info.value)


def test_load_valid_file(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text('[node]\nswarm_id = "abc"\n[transport]\ntype = "memory"\nnetwork = "n1"\n')
    config = load_config(path)
    assert config.node.swarm_id == "abc"
    assert isinstance(config.transport, MemoryTransportConfig)
    assert config.transport.network == "n1"


def test_every_example_config_loads() -> None:
    files = sorted(EXAMPLES.glob("*.toml"))
    if not files:
        pytest.skip(f"no example configs in {EXAMPLES} yet")
    failures = {}
    for path in files:
        try:
            load_config(path)
        except ConfigError as exc:
            failures[path.name] = str(exc)
    assert not failures, failures


# ---- one set of defaults (issue 34) --------------------------------------------------

LEARNING_SECTIONS = ("model", "prompt", "sampler", "train", "sapo", "tasks", "rewards")
LEARNING_SECTIONS += ("deltas", "eval")
"""Where an example's values decide what a node learns; [node], [transport], [gossip]
and [logging] are the example's own business."""
_KEY = re.compile(r"^\s*([A-Za-z0-9_]+)\s*=")
_HEADER = re.compile(r"^\s*\[\[?\s*([A-Za-z0-9_.]+)\s*\]\]?")


def _key_lines(text: str) -> dict[str, int]:
    """`section.key` -> its line index, for every key of a table and every `[[array]]`
    table (the line of its first header)."""
    where: dict[str, int] = {}
    section = ""
    for index, line in enumerate(text.splitlines()):
        if line.lstrip().startswith("#"):
            continue
        header = _HEADER.match(line)
        if header:
            section = header.group(1)
            if line.lstrip().startswith("[["):
                where.setdefault(section, index)
            continue
        key = _KEY.match(line)
        if key:
            where.setdefault(f"{section}.{key.group(1)}", index)
    return where


def _trailing_comment(line: str) -> bool:
    """Whether `line` has a `#` outside its strings (a TOML comment)."""
    quote = ""
    for char in line:
        if quote:
            quote = "" if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char == "#":
            return True
    return False


def _commented(lines: list[str], index: int) -> bool:
    above = lines[index - 1].strip() if index > 0 else ""
    return _trailing_comment(lines[index]) or above.startswith("#")


def _defaults_problems(path: Path) -> list[str]:
    """What the examples' rule refuses in `path` (see the test below)."""
    text = path.read_text()
    data = tomllib.loads(text)
    config, default = load_config(path), NodeConfig()
    lines, where = text.splitlines(), _key_lines(text)
    problems = []
    for section in LEARNING_SECTIONS:
        for key, value in data.get(section, {}).items():
            name = f"{section}.{key}"
            if key == "seed":
                problems.append(f"{name}: copies of this file would share it; leave it unset")
                continue
            ours = getattr(getattr(config, section), key)
            if isinstance(value, dict):  # a sub-table: its keys against its defaults
                base = type(ours)()
                for sub in value:
                    if getattr(ours, sub) == getattr(base, sub):
                        problems.append(f"{name}.{sub}: restates the default; delete it")
                continue
            if ours == getattr(getattr(default, section), key):
                problems.append(f"{name}: restates the default; delete it")
            elif not _commented(lines, where[name]):
                problems.append(f"{name}: differs from the default without a comment saying why")
    return problems


def test_examples_differ_from_the_defaults_only_with_a_reason() -> None:
    """Issue 34: the config models' defaults are the one set (they learn); an example
    restates none of them in the sections that decide learning, sets a different value
    only with a comment on that line or the line above saying why, and sets no seed
    (two nodes made from one example must not sample identical tasks)."""
    files = sorted(EXAMPLES.glob("*.toml"))
    assert files
    problems = {path.name: _defaults_problems(path) for path in files}
    assert not {name: found for name, found in problems.items() if found}, problems


def test_the_examples_rule_catches_what_it_should(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text(
        "[train]\nlearning_rate = 1e-5\nentropy_coef = 0.1\n"
        "[tasks]\nseed = 3\n[[tasks.mixture]]\nsource = 'add'\n"
        "[model.lora]\nenabled = false\n"
    )
    found = "\n".join(_defaults_problems(path))
    assert "train.learning_rate: differs from the default without a comment" in found
    assert "train.entropy_coef: restates the default" in found
    assert "tasks.seed: copies of this file would share it" in found
    assert "tasks.mixture: differs from the default without a comment" in found
    assert "model.lora.enabled: restates the default" in found
    path.write_text("[train]\n# slower: a pretrained model\nlearning_rate = 1e-5\n")
    assert _defaults_problems(path) == []
    path.write_text("[train]\nlearning_rate = 1e-5  # a pretrained model\n")
    assert _defaults_problems(path) == []


def test_a_minimal_config_gets_the_settings_that_learn() -> None:
    """The defaults are what `swarm init` and `swarm demo` used to write as their own
    copy (the set `tests/cli/test_init_learns.py` trains), not the set that did not
    learn (`add`, lr 1e-4, no entropy bonus, no format reward, 8 new tokens)."""
    config = parse_config({"node": {"name": "me"}})
    assert config.model.name_or_path == "builtin:tiny"
    assert [spec.source for spec in config.tasks.mixture] == ["digit"]
    assert (config.sampler.group_size, config.sampler.max_new_tokens) == (8, 2)
    assert (config.train.learning_rate, config.train.entropy_coef) == (3e-4, 0.1)
    assert config.rewards.format_weight == 0.5
    assert (config.sapo.local_groups, config.sapo.external_groups) == (4, 4)


def test_unset_seeds_come_from_the_key_and_set_ones_stay() -> None:
    config = parse_config({})
    assert config.model.seed is None and config.tasks.seed is None
    a = config.with_node_seeds(Identity.from_seed(b"a" * 32).peer_id)
    b = config.with_node_seeds(Identity.from_seed(b"b" * 32).peer_id)
    again = config.with_node_seeds(Identity.from_seed(b"a" * 32).peer_id)
    assert (a.model.seed, a.tasks.seed) == (again.model.seed, again.tasks.seed)  # a restart
    assert a.model.seed != b.model.seed and a.tasks.seed != b.tasks.seed
    assert a.model.seed != a.tasks.seed
    assert all(0 <= s < 2**53 for s in (a.model.seed, a.tasks.seed, b.model.seed))
    pinned = parse_config({"model": {"seed": 7}, "tasks": {"seed": 9}})
    assert pinned.with_node_seeds(Identity.from_seed(b"a" * 32).peer_id) == pinned
    half = parse_config({"model": {"seed": 7}}).with_node_seeds(
        Identity.from_seed(b"a" * 32).peer_id
    )
    assert (half.model.seed, half.tasks.seed) == (7, a.tasks.seed)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (
            {"train": {"foreign_eos": True}},
            'foreign_eos = true does nothing unless foreign_trajectory = "text"',
        ),
        ({"train": {"foreign_trajectory": "text", "foreign_stop": "all"}}, "foreign_stop"),
        ({"train": {"min_mean_logprob": -3.0}}, 'unless foreign_rule = "plausible"'),
        ({"train": {"schedule_steps": 500}}, 'unless lr_schedule = "linear" or "cosine"'),
        ({"sapo": {"cohort_ramp_rounds": 8}}, "unless cohort_rounds > 0"),
        ({"sapo": {"novelty_window": 4}}, 'unless external_selection = "signal"'),
        ({"model": {"master_weights": False}}, 'unless dtype = "bfloat16" or "float16"'),
        ({"model": {"lora": {"rank": 8}}}, "rank = 8 does nothing unless enabled = true"),
        ({"prompt": {"template": "plain", "few_shot": 0}}, "few_shot"),
        ({"sampler": {"vllm_max_model_len": 2048}}, 'unless backend = "vllm"'),
        ({"rewards": {"format_weight": 0.0, "answer_format": "answer_block"}}, "format_weight > 0"),
        ({"eval": {"every": 0, "num_tasks": 64}}, "unless every > 0"),
        ({"logging": {"wandb_project": "x"}}, 'unless backends includes "wandb"'),
        ({"deltas": {"density": 0.1}}, "unless enabled = true"),
        ({"deltas": {"enabled": True, "keyframe_every": 4}}, 'scheme = "choco"'),
        ({"deltas": {"enabled": True, "encoding": "dense_fp16", "bits": 4}}, 'encoding = "topk"'),
    ],
)
def test_a_knob_that_would_do_nothing_is_refused(data: dict, says: str) -> None:
    message = error_of(data)
    assert says in message, message
    assert "set that, or delete" in message
    section = next(iter(data))
    assert f"node.toml: {section}" in message


def test_the_same_knobs_are_accepted_where_they_act() -> None:
    parse_config(
        {
            "train": {
                "foreign_trajectory": "text",
                "foreign_eos": True,
                "foreign_rule": "plausible",
                "min_mean_logprob": -3.0,
                "lr_schedule": "cosine",
                "schedule_steps": 500,
            },
            "sapo": {"cohort_rounds": 8, "cohort_ramp_rounds": 8},
            "model": {"dtype": "bfloat16", "master_weights": False, "seed": 1},
            "logging": {"backends": ["wandb"], "wandb_project": "x"},
            "deltas": {"enabled": True, "scheme": "choco", "keyframe_every": 4},
        }
    )


def test_deltas_with_a_built_in_model_need_one_model_seed() -> None:
    message = error_of({"deltas": {"enabled": True}})
    assert "model.seed" in message and "model family" in message
    parse_config({"deltas": {"enabled": True}, "model": {"seed": 0}})


def test_trl_loss_options_are_checked_with_their_fix() -> None:
    assert parse_config({"train": {"delta": 4.0}}).train.delta == 4.0
    with pytest.raises(ConfigError, match=r"train\.delta"):
        parse_config({"train": {"delta": 0.9}})
    with pytest.raises(
        ConfigError, match=r"use_bias_correction_kl = true does nothing unless beta > 0"
    ):
        parse_config({"train": {"use_bias_correction_kl": True}})
    config = parse_config({"train": {"use_bias_correction_kl": True, "beta": 0.04}})
    assert config.train.use_bias_correction_kl
    with pytest.raises(ConfigError, match='use loss_type = "dapo"'):
        parse_config({"train": {"loss_type": "bnpo"}})
    assert parse_config({"train": {"scale_rewards": "batch"}}).train.scale_rewards == "batch"
