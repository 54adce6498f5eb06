"""The signed peer record py-libp2p 0.8.1 puts on every pubsub RPC, handled as a node
that restarts, and whose clock may step back, needs it handled.

What the library does and what replaces it (both pinned to libp2p==0.8.1: a check raises
at start if the replaced function moved):
- Sending (`cache_sender_records`): the library rebuilds our address list (multiaddr
  parsing, a `getsockname` per listener) and re-serializes our record for each RPC to see
  whether it changed: about a seventh of a publishing process's CPU for small messages.
  Here each host's answer is reused for `SENDER_RECORD_TTL_S` (a changed address reaches
  peers that much later; identify still pushes it at once).
- Receiving (`keep_rpcs_with_older_records`): a record's sequence number is its signer's
  wall-clock time, and the library drops a peer's *whole RPC* (subscriptions, messages,
  control) when its record is older than one stored for that peer. So a node restarted
  with its clock behind its previous run (an NTP step back, a restored VM, a board without
  a real-time clock, an RTC kept in local time) was deaf and mute to every peer that
  remembered it, silently, until its clock passed the old one: hours, or for ever.
  Here such a record is set aside (the stored one stays, as the library wants) and the
  RPC goes on: it came over a connection authenticated as that peer, whose messages
  carry their own signatures. A record that is forged, not this peer's or unreadable
  still drops the RPC, as before.

Invariants: nothing here owns a socket or a thread; each patch is idempotent and
replaces the library's function in every pubsub module that imported it.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from types import ModuleType

from libp2p.abc import IHost
from libp2p.peer import peerstore as _peerstore_module
from libp2p.peer.envelope import consume_envelope
from libp2p.peer.id import ID
from libp2p.pubsub import floodsub as _floodsub_module
from libp2p.pubsub import gossipsub as _gossipsub_module
from libp2p.pubsub import pubsub as _pubsub_module
from libp2p.pubsub import utils as _pubsub_utils
from libp2p.pubsub.pb import rpc_pb2

from swarm.bounded import BoundedDict

log = logging.getLogger("gossip.libp2p")

SENDER_RECORD_TTL_S = 1.0
"""How long a host's serialized signed peer record is reused for the RPCs it sends."""
RECORD_TTL_S = 7200
"""How long a consumed record's addresses stay in the peerstore (the library's value)."""


def _replace_everywhere(
    modules: tuple[ModuleType, ...], name: str, replacement: Callable[..., object]
) -> Callable[..., object]:
    """Put `replacement` in place of `name` in each module; return the library's own
    function (the same object in every module, or this raises)."""
    originals = set()
    for module in modules:
        current = getattr(module, name, None)
        if current is None:
            raise RuntimeError(
                f"{module.__name__}.{name} is gone; gossip/libp2p_records.py needs updating"
            )
        if current is not replacement:
            originals.add(current)
    if len(originals) > 1:
        raise RuntimeError(f"{name} was replaced elsewhere in {[m.__name__ for m in modules]}")
    for module in modules:
        setattr(module, name, replacement)
    return originals.pop() if originals else replacement


# --- sending -------------------------------------------------------------------------

_SENDER_RECORD_USERS = (_pubsub_module, _gossipsub_module)
_clock: Callable[[], float] = time.monotonic
_uncached_sender_record: Callable[[IHost], tuple[bytes, bool]] | None = None
_sender_records: weakref.WeakKeyDictionary[IHost, tuple[float, tuple[bytes, bool]]] = (
    weakref.WeakKeyDictionary()
)


def _cached_sender_record(host: IHost) -> tuple[bytes, bool]:
    """`env_to_send_in_RPC(host)`, reused for `SENDER_RECORD_TTL_S` per host."""
    assert _uncached_sender_record is not None
    now = _clock()
    held = _sender_records.get(host)
    if held is not None and now < held[0]:
        return held[1][0], False
    record = _uncached_sender_record(host)
    _sender_records[host] = (now + SENDER_RECORD_TTL_S, record)
    return record


def cache_sender_records() -> None:
    """Make pubsub reuse each host's signed peer record for `SENDER_RECORD_TTL_S`
    (idempotent). Raises if the library no longer builds it per RPC the pinned way."""
    global _uncached_sender_record
    original = _replace_everywhere(
        _SENDER_RECORD_USERS, "env_to_send_in_RPC", _cached_sender_record
    )
    if original is not _cached_sender_record:
        _uncached_sender_record = original  # type: ignore[assignment]


# --- receiving -----------------------------------------------------------------------

_RECORD_CONSUMERS = (_pubsub_module, _gossipsub_module, _floodsub_module)
older_records_kept = 0
"""RPCs processed although their sender record was older than the stored one."""
RECONSUME_EVERY_S = 60.0
"""A record a peer sends again byte for byte is taken without checking its signature
again, for this long after it was last checked (and stored). Checked per RPC, its Ed25519
verification was the most costly step of reading a peer's RPCs after the loop wake-ups."""
_ACCEPTED_MAX = 4096
_accepted: weakref.WeakKeyDictionary[IHost, BoundedDict[ID, tuple[bytes, float]]] = (
    weakref.WeakKeyDictionary()
)


def consume_sender_record(msg: rpc_pb2.RPC, host: IHost, peer_id: ID) -> bool:
    """Whether to process `msg` from `peer_id`: yes without a record, with a record that
    is stored, or with an authentic record of this peer older than the stored one (a
    restart with the clock behind; the stored record stays). No for a record that does
    not parse, is not signed by its peer or is another peer's."""
    if not msg.HasField("senderRecord"):
        return True
    accepted = _accepted.get(host)
    if accepted is None:
        accepted = _accepted[host] = BoundedDict(_ACCEPTED_MAX)
    now = _clock()
    held = accepted.get(peer_id)
    if held is not None and held[0] == msg.senderRecord and now < held[1]:
        return True
    if _record_accepted(msg, host, peer_id):
        accepted[peer_id] = (msg.senderRecord, now + RECONSUME_EVERY_S)
        return True
    return False


def _record_accepted(msg: rpc_pb2.RPC, host: IHost, peer_id: ID) -> bool:
    """`consume_sender_record`'s verdict on a record it has not accepted lately."""
    global older_records_kept
    try:
        envelope, record = consume_envelope(msg.senderRecord, "libp2p-peer-record")
    except Exception as exc:  # noqa: BLE001 - the library raises many kinds for bad bytes
        log.debug("refused an RPC of %s: unreadable sender record (%r)", peer_id, exc)
        return False
    if record.peer_id != peer_id or ID.from_pubkey(envelope.public_key) != peer_id:
        log.debug("refused an RPC of %s: its sender record is not its own", peer_id)
        return False
    peerstore = host.get_peerstore()
    if peerstore.consume_peer_record(envelope, RECORD_TTL_S):
        return True
    stored = peerstore.get_peer_record(peer_id)
    if stored is not None and stored.record().seq > record.seq:
        older_records_kept += 1
        if older_records_kept == 1 or older_records_kept % 1000 == 0:
            log.info("peer %s sends a signed peer record older than one it sent before "
                     "(restarted with its clock behind?): kept the newer one, and its "
                     "messages (%d such RPCs so far)", peer_id, older_records_kept)  # fmt: skip
        return True
    return False


def keep_rpcs_with_older_records() -> None:
    """Replace the library's `maybe_consume_signed_record` in pubsub with
    `consume_sender_record` (idempotent; raises if the library moved it)."""
    if _pubsub_utils.maybe_consume_signed_record is not consume_sender_record:
        if not hasattr(_peerstore_module.PeerStore, "consume_peer_record"):
            raise RuntimeError("PeerStore.consume_peer_record is gone; see libp2p_records.py")
    _replace_everywhere(
        (*_RECORD_CONSUMERS, _pubsub_utils), "maybe_consume_signed_record", consume_sender_record
    )
