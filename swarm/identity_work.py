"""Proof of work on an identity: what a swarm may ask of every key whose groups it uses.

Keys are free, so a Sybil army of keys costs nothing (issue 35). A swarm that sets
`[gossip] identity_work_bits = B` asks each key for a nonce such that

    sha256(DOMAIN || swarm_id || 0x00 || peer_id || nonce as 8 bytes, big-endian)

starts with B zero bits. A node mints its nonce once per key and swarm (2**B hashes on
average; `mint_seconds` estimates it), sends it in its hello, and its peers use its
groups and deltas only once a hello with valid work arrived. Checking costs one hash.

Invariants:
- Pure and deterministic: the same inputs give the same answer on every machine; no
  clock, no randomness, no I/O.
- The digest binds the swarm and the key: work for one swarm or key is worth nothing for
  another (a Sybil must mint per key, and cannot reuse a key's work across swarms).
- `mint` returns the smallest nonce >= `start` with enough work, so minting resumes
  where an interrupted mint stopped.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

DOMAIN = b"swarm-identity-work/1\x00"
MAX_BITS = 32
"""The most a swarm may ask: ~4 billion hashes, hours of one core."""
MAX_NONCE = 2**64 - 1
PROGRESS_EVERY = 1 << 20
"""`mint` reports progress every this many hashes."""


def _prefix(swarm_id: str, peer_id: str) -> hashlib._Hash:
    prefix = hashlib.sha256(DOMAIN)
    prefix.update(swarm_id.encode() + b"\x00" + peer_id.encode())
    return prefix


def work_digest(swarm_id: str, peer_id: str, nonce: int) -> bytes:
    digest = _prefix(swarm_id, peer_id)
    digest.update(nonce.to_bytes(8, "big"))
    return digest.digest()


def leading_zero_bits(digest: bytes) -> int:
    bits = 0
    for byte in digest:
        if byte:
            return bits + 8 - byte.bit_length()
        bits += 8
    return bits


def has_work(swarm_id: str, peer_id: str, nonce: int | None, bits: int) -> bool:
    """Whether `nonce` is at least `bits` bits of work on `peer_id` for `swarm_id`
    (always, for `bits` 0; never, for a missing or out-of-range nonce otherwise)."""
    if bits <= 0:
        return True
    if nonce is None or not 0 <= nonce <= MAX_NONCE:
        return False
    return leading_zero_bits(work_digest(swarm_id, peer_id, nonce)) >= bits


def mint(
    swarm_id: str,
    peer_id: str,
    bits: int,
    *,
    start: int = 0,
    on_progress: Callable[[int], None] | None = None,
) -> int:
    """The smallest nonce >= `start` with `bits` bits of work; `on_progress(hashes)`
    every `PROGRESS_EVERY` hashes (it may raise to stop the mint)."""
    if not 0 <= bits <= MAX_BITS:
        raise ValueError(f"bits must be in [0, {MAX_BITS}], got {bits}")
    prefix = _prefix(swarm_id, peer_id)
    # A digest with `bits` leading zero bits is one below 2**(256 - bits).
    bound = 1 << (256 - bits)
    nonce = start
    while nonce <= MAX_NONCE:
        digest = prefix.copy()
        digest.update(nonce.to_bytes(8, "big"))
        if int.from_bytes(digest.digest(), "big") < bound:
            return nonce
        nonce += 1
        if on_progress is not None and (nonce - start) % PROGRESS_EVERY == 0:
            on_progress(nonce - start)
    raise ValueError("no nonce has that much work")  # 2**64 hashes: not reached


def mint_seconds(bits: int, hashes_per_s: float) -> float:
    """Expected minting time at `hashes_per_s` (2**bits hashes on average)."""
    return float(2**bits) / hashes_per_s
