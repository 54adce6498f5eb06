"""Noticing a node that holds connections to peers and hears nothing from any of them.

Every node says hello at least every `node.peer_loops.ANNOUNCE_EVERY_S` (5 s), so a node
connected to peers for `SILENT_AFTER_S` that has received no message at all is in nobody's
mesh, and would otherwise train alone without saying why. Found by hand: a second node
started with a copy of another's key (a copied data dir or key file) connects, and libp2p
then lets only one of the two be heard, silently; before `gossip.libp2p_records`, a node
restarted with its clock behind was deaf the same way. A peer whose process is stopped
(found by hand: SIGSTOP for 40 s) keeps its connection open and sends nothing, so the
warning names that cause first.

Invariants: pure bookkeeping on what it is given (no clock, no I/O); `observe` returns a
warning at most once per `REPEAT_S` while a silence lasts, and anew after any message
ends it. Only real connections count (a broker is not a peer: alone on one, a node
rightly hears nothing).
"""

from __future__ import annotations

from typing import Any

SILENT_AFTER_S = 30.0
REPEAT_S = 600.0


def real_connections(transport: Any) -> int:
    """Peers `transport` holds a connection to, for transports that report real
    connections (libp2p's `peer_links`); 0 for the others (a broker, simnet)."""
    links = getattr(transport, "peer_links", None)
    return len(links()) if links is not None else 0


class SilenceWatch:
    def __init__(self) -> None:
        self._since: float | None = None
        self._warned_at: float | None = None
        self._messages_in = -1

    def observe(self, now: float, connected: int, messages_in: int) -> str | None:
        """`connected`: peers we hold a connection to now; `messages_in`: messages
        received so far (any, accepted or not). A warning to log, or None."""
        heard = messages_in != self._messages_in and self._messages_in >= 0
        self._messages_in = messages_in
        if heard or connected == 0:
            self._since = now if connected else None  # silence counts from now
            self._warned_at = None
            return None
        if self._since is None:
            self._since = now
        silent = now - self._since
        if silent < SILENT_AFTER_S:
            return None
        if self._warned_at is not None and now - self._warned_at < REPEAT_S:
            return None
        self._warned_at = now
        return (
            f"connected to {connected} peer(s) for {silent:.0f} s and heard nothing from "
            f"anyone (every node says hello every few seconds). Are they stopped (a "
            f"suspended machine, a process stopped with Ctrl-Z)? Is another node running "
            f"with this node's key (a copied data dir or key file)? Give each node its own "
            f"node.key. Otherwise peers may be refusing us: their `swarm status` says why. "
            f"Training alone meanwhile."
        )
