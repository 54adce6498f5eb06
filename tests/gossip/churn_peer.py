"""Many short-lived libp2p identities in one OS process, for the connection-churn tests.

    python tests/gossip/churn_peer.py --target MULTIADDR

Each identity is a fresh Ed25519 key that opens one TCP connection to `--target` (a
node's full multiaddr with /p2p/<peer id>), completes Noise and Yamux as any peer does,
then proves the node took it: it opens a stream and reads the node's identify answer
(`/ipfs/id/1.0.0`), which the node serves only on a connection it registered. It
leaves cleanly (Yamux GoAway, then the socket closed). No host, swarm or peerstore is
built per identity, so hundreds cost seconds, not minutes.

JSON lines on stdout, commands on stdin (EOF or `quit` ends the process):

    {"event": "ready"}
    `churn COUNT`  COUNT identities one after another, each connecting and leaving before
                   the next connects; answers {"event": "churned", "ok": n, "failed": n,
                   "first_failed": i | null, "errors": {...}, "seconds": t}
    `open COUNT`   COUNT identities connecting at once, kept open; answers
                   {"event": "opened", ...} (same fields) once every one is up or failed
    `close`        the identities kept by `open` leave at once; answers
                   {"event": "closed", "count": n, "seconds": t}

Invariants: every connection this process opens is closed by `close`, `quit` or EOF;
an identity counts as `ok` only once the node answered on its connection.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import multiaddr
import trio
from libp2p import create_yamux_muxer_option
from libp2p.abc import IMuxedConn
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_new_x25519_key_pair
from libp2p.custom_types import TProtocol
from libp2p.identity.identify.identify import ID as IDENTIFY_PROTOCOL
from libp2p.peer.id import ID
from libp2p.protocol_muxer.multiselect_client import MultiselectClient
from libp2p.protocol_muxer.multiselect_communicator import MultiselectCommunicator
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.transport.tcp.tcp import TCP
from libp2p.transport.upgrader import TransportUpgrader

from tests.gossip.peer_process import emit

CONNECT_TIMEOUT_S = 10.0


def _upgrader() -> TransportUpgrader:
    """Noise with a fresh identity, then Yamux: one per connection (one key each)."""
    key_pair = create_new_key_pair()
    noise = NoiseTransport(key_pair, noise_privkey=create_new_x25519_key_pair().private_key)
    return TransportUpgrader(
        secure_transports_by_protocol={TProtocol(NOISE_PROTOCOL_ID): noise},
        muxer_transports_by_protocol=create_yamux_muxer_option(),
    )


class Churner:
    def __init__(self, target: str) -> None:
        maddr = multiaddr.Multiaddr(target)
        self.peer_id = ID.from_base58(maddr.value_for_protocol("p2p"))
        self.addr = maddr.decapsulate(multiaddr.Multiaddr(f"/p2p/{self.peer_id}"))
        self.tcp = TCP()
        self.held: list[IMuxedConn] = []

    async def connect(self, nursery: trio.Nursery) -> IMuxedConn:
        """One new identity connected, its muxer running in `nursery`, and the node's
        identify answer read; raises on any failure (the connection is then closed)."""
        with trio.fail_after(CONNECT_TIMEOUT_S):
            raw = await self.tcp.dial(self.addr)
            muxed: IMuxedConn | None = None
            try:
                upgrader = _upgrader()
                secured = await upgrader.upgrade_security(raw, True, self.peer_id)
                muxed = await upgrader.upgrade_connection(secured, self.peer_id)
                nursery.start_soon(muxed.start)
                await muxed.event_started.wait()
                stream = await muxed.open_stream()
                await MultiselectClient().select_one_of(
                    [IDENTIFY_PROTOCOL], MultiselectCommunicator(stream)
                )
                if not await stream.read(1):
                    raise ConnectionError("the node closed the identify stream unanswered")
                return muxed
            except BaseException:
                with trio.CancelScope(shield=True):
                    await (muxed.close() if muxed is not None else raw.close())
                raise

    @staticmethod
    async def leave(muxed: IMuxedConn) -> None:
        """GoAway and socket closed; returns without the muxer's 0.1 s linger."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(muxed.close)
            await muxed.event_closed.wait()  # set once the socket is closed
            nursery.cancel_scope.cancel()

    async def churn(self, count: int, nursery: trio.Nursery) -> dict[str, Any]:
        errors: Counter[str] = Counter()
        first_failed: int | None = None
        t0 = time.perf_counter()
        for i in range(count):
            try:
                muxed = await self.connect(nursery)
            except Exception as exc:  # noqa: BLE001 - counted and reported by type
                errors[type(exc).__name__] += 1
                if first_failed is None:
                    first_failed = i
                continue
            await self.leave(muxed)
        return {
            "ok": count - sum(errors.values()),
            "failed": sum(errors.values()),
            "first_failed": first_failed,
            "errors": dict(errors),
            "seconds": round(time.perf_counter() - t0, 3),
        }

    async def open(self, count: int, nursery: trio.Nursery) -> dict[str, Any]:
        errors: Counter[str] = Counter()
        t0 = time.perf_counter()

        async def one() -> None:
            try:
                self.held.append(await self.connect(nursery))
            except Exception as exc:  # noqa: BLE001 - counted and reported by type
                errors[type(exc).__name__] += 1

        async with trio.open_nursery() as wave:
            for _ in range(count):
                wave.start_soon(one)
        return {
            "ok": count - sum(errors.values()),
            "failed": sum(errors.values()),
            "first_failed": None,
            "errors": dict(errors),
            "seconds": round(time.perf_counter() - t0, 3),
        }

    async def close(self) -> dict[str, Any]:
        held, self.held = self.held, []
        t0 = time.perf_counter()
        async with trio.open_nursery() as wave:
            for muxed in held:
                wave.start_soon(self.leave, muxed)
        return {"count": len(held), "seconds": round(time.perf_counter() - t0, 3)}


async def main_async(args: argparse.Namespace) -> None:
    churner = Churner(args.target)
    stdin = trio.lowlevel.FdStream(sys.stdin.fileno())
    async with trio.open_nursery() as nursery:
        emit("ready")
        buffer = b""
        try:
            while True:
                while b"\n" not in buffer:
                    chunk = await stdin.receive_some(4096)
                    if not chunk:
                        return
                    buffer += chunk
                line, buffer = buffer.split(b"\n", 1)
                words = line.decode().split()
                if not words:
                    continue
                if words[0] == "churn":
                    emit("churned", **await churner.churn(int(words[1]), nursery))
                elif words[0] == "open":
                    emit("opened", **await churner.open(int(words[1]), nursery))
                elif words[0] == "close":
                    emit("closed", **await churner.close())
                elif words[0] == "quit":
                    return
        finally:
            with trio.CancelScope(shield=True):
                await churner.close()
            nursery.cancel_scope.cancel()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="the node's multiaddr with /p2p/<id>")
    trio.run(main_async, p.parse_args())


if __name__ == "__main__":
    main()
