"""`build_node` refuses what it can before loading a model (a real model takes a minute)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

import node.policy_learner
from node.build import build_node
from swarm.config import parse_config
from swarm.errors import ConfigError


def test_a_taken_listen_port_is_refused_before_the_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 34: the port-in-use error came after the model had loaded."""

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model was loaded before the port was checked")

    monkeypatch.setattr(node.policy_learner, "PolicyLearner", no_model)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = parse_config(
            {
                "node": {"name": "n", "data_dir": str(tmp_path / "n")},
                "transport": {"type": "libp2p", "listen": f"/ip4/127.0.0.1/tcp/{port}"},
            }
        )
        with pytest.raises(ConfigError, match="another process listens on that port"):
            build_node(config)
