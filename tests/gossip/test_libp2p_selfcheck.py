"""The start-up check of py-libp2p's internals (`gossip.libp2p_selfcheck`, issue 34): it
passes on the pinned version, and each kind of change it guards against (a private hook
gone, a hook no longer called, a module global gone, an instance attribute gone) stops a
transport's start with an error naming the library, its version and the pin."""

from __future__ import annotations

import asyncio
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

import pytest
from libp2p import new_host
from libp2p.host.autonat.autonat import AutoNATService
from libp2p.network.swarm import Swarm
from libp2p.pubsub import pubsub as pubsub_module
from libp2p.pubsub import rpc_queue
from libp2p.pubsub.gossipsub import GossipSub
from libp2p.pubsub.pubsub import Pubsub
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

from gossip.libp2p import Libp2pTransport
from gossip.libp2p_selfcheck import LIBP2P_PIN, check_instance, check_libp2p_internals
from swarm.config.network import Libp2pTransportConfig
from swarm.identity import Identity
from swarm.internals import LibraryInternalsChanged

INSTALLED = version("libp2p")


def _assert_names_library(exc: pytest.ExceptionInfo[LibraryInternalsChanged], *what: str) -> None:
    text = str(exc.value)
    assert f"py-libp2p {INSTALLED} (installed)" in text
    assert LIBP2P_PIN in text and "pyproject.toml" in text
    for part in what:
        assert part in text, (part, text)


def test_the_installed_libp2p_passes() -> None:
    assert LIBP2P_PIN == f"libp2p=={INSTALLED}"  # the pin is what is installed
    check_libp2p_internals(new_host(), nat=True)
    check_libp2p_internals(None, nat=False)


@pytest.mark.parametrize(
    ("owner", "name", "user"),
    [
        (Pubsub, "_is_msg_seen", "libp2p_patches.py"),
        (Pubsub, "_mark_msg_seen", "libp2p_forward_gate.py"),
        (GossipSub, "_check_equivocation", "libp2p_patches.py"),
        (GossipSub, "_select_peers_for_pruning", "libp2p_mesh.py"),
        (Swarm, "_build_remote_multiaddr", "libp2p_inbound.py"),
        (Swarm, "unblock_peer", "libp2p_dialer.py"),
        (AutoNATService, "_try_dial", "nat.py"),
        (AutoNATService, "_handle_request", "nat.py"),
        (DCUtRProtocol, "_auto_drive_loop", "nat.py"),
        (CircuitV2Protocol, "_handle_connect", "relay.py"),
        (pubsub_module, "env_to_send_in_RPC", "libp2p_records.py"),
    ],
)
def test_a_missing_internal_fails_loudly(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, user: str
) -> None:
    monkeypatch.delattr(owner, name)
    with pytest.raises(LibraryInternalsChanged) as exc:
        check_libp2p_internals(new_host(), nat=True)
    _assert_names_library(exc, f".{name} is missing", user)


def test_a_hook_the_library_no_longer_calls_fails_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def heartbeat(self: Any) -> None:  # a version that renamed the cleanup hook
        self._cleanup_security_state()

    monkeypatch.setattr(GossipSub, "heartbeat", heartbeat)
    with pytest.raises(LibraryInternalsChanged) as exc:
        check_libp2p_internals(None, nat=False)
    _assert_names_library(exc, "GossipSub.heartbeat no longer uses _periodic_security_cleanup")


def test_an_instance_attribute_a_constructor_no_longer_sets_fails_loudly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = rpc_queue.RpcQueue.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        del self._queue

    monkeypatch.setattr(rpc_queue.RpcQueue, "__init__", init)
    with pytest.raises(LibraryInternalsChanged) as exc:
        check_libp2p_internals(None, nat=False)
    _assert_names_library(exc, "RpcQueue instance._queue is missing")
    with pytest.raises(LibraryInternalsChanged, match="counter is a str, not int"):
        check_instance(SimpleNamespace(counter="0"), [("counter", int)], "here")


def test_nat_reaches_are_checked_only_with_nat_traversal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(AutoNATService, "_try_dial")
    check_libp2p_internals(new_host(), nat=False)


def test_the_transport_does_not_start_on_changed_internals(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(Pubsub, "_mark_msg_seen")
    transport = Libp2pTransport(
        Libp2pTransportConfig(listen="/ip4/127.0.0.1/tcp/0"), Identity.generate()
    )

    async def start() -> None:
        try:
            await transport.start()
        finally:
            await transport.stop()

    with pytest.raises(LibraryInternalsChanged) as exc:
        asyncio.run(start())
    _assert_names_library(exc, "Pubsub._mark_msg_seen is missing")
