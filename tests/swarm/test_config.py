"""Config: errors name the file and field; every checked-in example loads."""

from __future__ import annotations

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
