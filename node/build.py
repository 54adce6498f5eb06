"""Building a node's parts from its config: the only place they are wired together.

Invariant: each part receives only its own config section.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gossip.factory import make_transport
from gossip.layer import Gossip
from node.runner import Node, RoundReport
from node.workers import RescoreWorkers
from rewards.mixture import variants
from swarm.clock import WallClock
from swarm.config import NodeConfig, parse_config
from swarm.identity import Identity, load_or_create_key_file


def apply_overrides(
    config: NodeConfig, overrides: dict[str, dict[str, Any]], source: str
) -> NodeConfig:
    """Re-validate `config` with section-level overrides (e.g. from CLI flags)."""
    data = config.model_dump(mode="json", exclude_none=True)
    for section, values in overrides.items():
        values = {k: v for k, v in values.items() if v is not None}
        current = data.setdefault(section, {})
        if "type" in values and current.get("type") != values["type"]:
            data[section] = values  # another variant of a union: its keys differ
        else:
            current.update(values)
    return parse_config(data, source)


def build_gossip(config: NodeConfig, identity: Identity) -> Gossip:
    transport = make_transport(config.transport, identity, data_dir=config.node.data_dir)
    return Gossip(transport, identity, config.node.swarm_id, config.gossip, WallClock())


def build_node(
    config: NodeConfig,
    on_round: Callable[[RoundReport], None] | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> Node:
    from node.policy_learner import PolicyLearner  # torch import: only when a node is built

    identity = load_or_create_key_file(config.node.resolved_key_file)
    config = config.with_node_seeds(identity.peer_id)  # unset seeds: from the key
    if config.transport.type == "libp2p":  # before the model loads (a minute, for some)
        from gossip.libp2p_listen import refuse_unusable_listen

        refuse_unusable_listen(config.transport.listen)
    gossip = build_gossip(config, identity)
    learner = PolicyLearner(config)
    return Node(
        config,
        gossip,
        learner,
        WallClock(),
        on_round=on_round,
        on_event=on_event,
        capabilities=("rollouts",),
        # Peers choose the tasks we regenerate and the text we score: never on the loop.
        # A node with J = 0 re-scores nothing, so it starts no worker processes.
        rescorer=RescoreWorkers.from_config(learner.rewards_config, variants=variants(config.tasks))
        if config.sapo.external_groups > 0
        else None,
    )
