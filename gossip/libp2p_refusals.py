"""What the libp2p transport refused, counted by reason, logged without flooding.

Invariants: the reasons are fixed (`INCOMING_REASONS` for what a peer sent,
`OUTGOING_REASONS` for our own messages not sent); every refusal anywhere in the transport
is counted in one `Refusals` (read by `Libp2pTransport.stats()`) and logged once per
(reason, peer) per `_LOG_REPEAT_S`, never once per message. No socket, no thread.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict

log = logging.getLogger("gossip.libp2p")

_LOG_REPEAT_S = 600.0
_LOG_KEYS = 4096

INCOMING_REASONS = (
    "oversize_rpc",
    "malformed_rpc",
    "unsigned",
    "bad_signature",
    "equivocation",
    "not_forwarded",
    "ignored_forwarder",
    "forwarder_rate_limited",
)
"""Reasons for refusing what a peer sent (`Refusals.counts`)."""
OUTGOING_REASONS = ("skipped_slow_peer",)
"""Reasons for not sending our own message to a peer."""


class Refusals:
    """Counts of what the transport refused, by reason, and their rate-limited log.

    Invariants: `counts` has a fixed key set (every reason, from the start), so another
    thread may copy it at any time while the trio thread increments; an unknown reason
    raises `KeyError` (our bug). A (reason, peer) pair is logged at WARNING the first
    time and again at most once per `_LOG_REPEAT_S` (with the number since), otherwise
    at DEBUG; at most `_LOG_KEYS` pairs are remembered.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(INCOMING_REASONS + OUTGOING_REASONS, 0)
        self._logged: OrderedDict[tuple[str, str], tuple[float, int]] = OrderedDict()

    def add(self, reason: str, peer: str, detail: str) -> None:
        """Count one refusal of `reason` concerning `peer`; `detail` goes to the log."""
        self.counts[reason] += 1
        key = (reason, peer)
        now = time.monotonic()
        last = self._logged.get(key)
        if last is not None and now - last[0] < _LOG_REPEAT_S:
            self._logged[key] = (last[0], last[1] + 1)
            log.debug("%s (peer %s): %s", reason, peer, detail)
            return
        since = f"; {last[1]} more since the last report" if last is not None and last[1] else ""
        log.warning(
            "%s (peer %s): %s%s (counted in stats; repeats are logged at DEBUG for %.0f s)",
            reason,
            peer,
            detail,
            since,
            _LOG_REPEAT_S,
        )
        self._logged[key] = (now, 0)
        self._logged.move_to_end(key)
        while len(self._logged) > _LOG_KEYS:
            self._logged.popitem(last=False)

    def incoming(self) -> dict[str, int]:
        return {reason: self.counts[reason] for reason in INCOMING_REASONS}
