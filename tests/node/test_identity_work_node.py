"""A swarm that asks for proof of work on keys (`gossip.identity_work_bits`, issue 35
item 2): its nodes mint it once, send it in their hellos, and use only the groups of keys
that did it; a key without it is counted, not blamed, and stays out of the peers table."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from gossip.memory import MemoryNetwork
from node.identity_proof import WORK_FILE, identity_work_nonce
from node.metrics import read_metrics
from swarm.config import NodeConfig
from swarm.identity_work import has_work
from tests.node.helpers import stub_config, stub_node

BITS = 12


def _asking(config: NodeConfig, bits: int) -> NodeConfig:
    gossip = config.gossip.model_copy(update={"identity_work_bits": bits})
    return config.model_copy(update={"gossip": gossip})


def test_only_keys_with_the_swarms_proof_of_work_are_used(tmp_path: Path) -> None:
    network = MemoryNetwork("identity-work")
    configs = [
        _asking(stub_config(tmp_path, "a"), BITS),
        _asking(stub_config(tmp_path, "b"), BITS),
        stub_config(tmp_path, "c"),  # asks for nothing and sends no work
    ]
    nodes = [stub_node(c, network, seed=i) for i, c in enumerate(configs)]
    a, b, c = nodes

    def used(node: object) -> set[str]:
        path = Path(node.config.node.data_dir) / "metrics.jsonl"  # type: ignore[attr-defined]
        records = read_metrics(path) if path.exists() else []
        return {sender for r in records for sender in r["external_by_sender"]}

    def done() -> bool:
        # c's groups reach a and b only after c's first round, which a loaded machine can
        # hold back until a and b are past their 12th (a CI-like run failed so): wait for
        # the drops too.
        return (
            all(n.rounds_done >= 12 for n in nodes)
            and b.peer_id in used(a)
            and a.peer_id in used(b)
            and used(c) >= {a.peer_id, b.peer_id}
            and all(n.drops["no_identity_work"] > 0 for n in (a, b))
        )

    async def run_all() -> None:
        # Until each has used what it may (or 60 s): a group that arrives before its
        # sender's hello is dropped, and a node's first hello may go out before its peers
        # listen; the next comes within 5 s, longer than a stub node's 12 rounds take.
        runs = [asyncio.create_task(node.run(None)) for node in nodes]
        deadline = time.monotonic() + 60.0
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for node in nodes:
            node.request_stop()
        await asyncio.gather(*runs)

    asyncio.run(run_all())
    for node, other in ((a, b), (b, a)):
        assert used(node) == {other.peer_id}, used(node)
        # Counted (what the metrics line reports); the last line may predate the first
        # drop, which `done` waited for.
        assert node.drops["no_identity_work"] > 0
        assert c.peer_id not in node.intake.peers  # its hellos were not noted
        assert node.peer_faults[c.peer_id] == 0  # counted, not blamed
        stored = json.loads((Path(node.config.node.data_dir) / WORK_FILE).read_text())
        assert stored["peer_id"] == node.peer_id and stored["bits"] == BITS
        assert has_work(node.config.node.swarm_id, node.peer_id, stored["nonce"], BITS)
    # The node that asks for nothing uses everyone's groups (work or not).
    assert used(c) == {a.peer_id, b.peer_id}


def test_the_stored_work_is_reused_and_minted_again_only_when_it_does_not_hold(
    tmp_path: Path,
) -> None:
    nonce = identity_work_nonce(tmp_path, "s", "key", 8)
    path = tmp_path / WORK_FILE
    assert identity_work_nonce(tmp_path, "s", "key", 8) == nonce  # reused
    path.write_text(json.dumps({"swarm_id": "s", "peer_id": "key", "bits": 8, "nonce": nonce + 1}))
    if not has_work("s", "key", nonce + 1, 8):  # a forged file is checked, not trusted
        assert identity_work_nonce(tmp_path, "s", "key", 8) == nonce
    assert has_work("s", "other", identity_work_nonce(tmp_path, "s", "other", 8), 8)
    assert json.loads(path.read_text())["peer_id"] == "other"
    path.write_text("{not json")
    assert has_work("s", "other", identity_work_nonce(tmp_path, "s", "other", 8), 8)
