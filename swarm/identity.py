"""Node identities: Ed25519 keys, libp2p-format peer ids, signatures.

Invariants:
- A key file holds the 32-byte Ed25519 seed, hex encoded, and is created with mode 0600.
  A key file readable by group or others is refused (it would let anyone impersonate
  the node).
- The peer id is exactly libp2p's: base58btc of the identity multihash of the
  protobuf-encoded public key, so the same key is the node's libp2p host identity and a
  receiver can recover the public key from the sender id alone (no key exchange).
- A peer id holding a small-order public key is refused (`bad_sender`): for such a key
  some Ed25519 implementations (OpenSSL's) accept trivial signatures on any message, so
  anyone could sign as it.
- One Ed25519 library: key derivation, signing and verification all run in libsodium
  (PyNaCl), about 1.8x faster than OpenSSL here; libp2p's own Ed25519 keys (the host
  key, `gossip.libp2p`) are PyNaCl too. An `Identity` holds only its seed (never shown
  by `repr`). Ed25519 signatures are deterministic (RFC 8032), so the bytes are those any
  implementation makes with the same key; libsodium's verification is the strict kind
  (canonical S and R, no small-order R or key), which refuses no signature an honest
  signer makes.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from nacl.bindings import crypto_sign, crypto_sign_open, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError

from swarm.errors import ConfigError, WireError

_B58_ALPHABET = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_B58_INDEX = {c: i for i, c in enumerate(_B58_ALPHABET)}
# protobuf PublicKey{Type: Ed25519 (=1), Data: 32 bytes}
_PB_ED25519_PREFIX = b"\x08\x01\x12\x20"
# identity multihash: code 0x00, length 36
_MH_IDENTITY_PREFIX = b"\x00\x24"
PEER_ID_MAX_CHARS = 64
# Encodings (sign bit cleared) of the 8 small-order Ed25519 points, including the
# non-canonical ones, as in libsodium's blocklist.
_SMALL_ORDER_KEYS = frozenset(
    bytes.fromhex(h)
    for h in (
        "00" * 32,
        "01" + "00" * 31,
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
        "ec" + "ff" * 30 + "7f",
        "ed" + "ff" * 30 + "7f",
        "ee" + "ff" * 30 + "7f",
    )
)


def b58encode(data: bytes) -> str:
    n = int.from_bytes(data, "big")
    out = []
    while n:
        n, rem = divmod(n, 58)
        out.append(_B58_ALPHABET[rem])
    pad = len(data) - len(data.lstrip(b"\x00"))
    return "1" * pad + "".join(reversed(out))


def b58decode(text: str) -> bytes:
    n = 0
    for char in text:
        if char not in _B58_INDEX:
            raise ValueError(f"invalid base58 character {char!r}")
        n = n * 58 + _B58_INDEX[char]
    body = n.to_bytes((n.bit_length() + 7) // 8, "big") if n else b""
    pad = len(text) - len(text.lstrip("1"))
    return b"\x00" * pad + body


def peer_id_from_public_bytes(public: bytes) -> str:
    if len(public) != 32:
        raise ValueError("an Ed25519 public key is 32 bytes")
    return b58encode(_MH_IDENTITY_PREFIX + _PB_ED25519_PREFIX + public)


_MH_SHA2_256 = 0x12


def is_peer_id_text(text: str) -> bool:
    """Whether `text` is a libp2p peer id as logs print it: base58btc of a multihash,
    identity (`12D3KooW...`, an inlined key) or sha2-256 (`Qm...`, a hashed larger key),
    whatever the key type. Catches ids cut short or mistyped when copied by hand."""
    if not 0 < len(text) <= PEER_ID_MAX_CHARS:
        return False
    try:
        raw = b58decode(text)
    except ValueError:
        return False
    if len(raw) < 2 or raw[1] >= 0x80:  # every digest a peer id holds is < 128 bytes
        return False
    code, length = raw[0], raw[1]
    if code == _MH_SHA2_256 and length != 32:
        return False
    return code in (0x00, _MH_SHA2_256) and len(raw) == 2 + length


def public_bytes_from_peer_id(peer_id: str) -> bytes:
    """Recover the Ed25519 public key inside a peer id; WireError if it holds none."""
    if not isinstance(peer_id, str) or not 0 < len(peer_id) <= PEER_ID_MAX_CHARS:
        raise WireError("bad_sender", "peer id has the wrong length")
    try:
        raw = b58decode(peer_id)
    except ValueError as exc:
        raise WireError("bad_sender", str(exc)) from None
    prefix = _MH_IDENTITY_PREFIX + _PB_ED25519_PREFIX
    if len(raw) != len(prefix) + 32 or not raw.startswith(prefix):
        raise WireError("bad_sender", "peer id is not an Ed25519 identity multihash")
    public = raw[len(prefix) :]
    if public[:31] + bytes([public[31] & 0x7F]) in _SMALL_ORDER_KEYS:
        raise WireError("bad_sender", "small-order Ed25519 public key")
    return public


@functools.lru_cache(maxsize=4096)
def _public_key(peer_id: str) -> bytes:
    """The key inside `peer_id`, parsed once per peer (base58 decoding costs about a
    third of a small message's verification); ids that hold no key are not cached."""
    return public_bytes_from_peer_id(peer_id)


def verify(peer_id: str, message: bytes, signature: bytes) -> None:
    """Raise WireError("bad_signature") unless `signature` by `peer_id` covers `message`."""
    if not isinstance(peer_id, str):
        raise WireError("bad_sender", "peer id is not a string")
    public = _public_key(peer_id)
    if not isinstance(signature, bytes) or len(signature) != 64:
        raise WireError("bad_signature", "an Ed25519 signature is 64 bytes")
    try:
        crypto_sign_open(signature + bytes(message), public)
    except BadSignatureError:
        raise WireError("bad_signature", f"signature does not verify for {peer_id}") from None


@dataclass(frozen=True)
class Identity:
    """A node's signing key (its 32-byte Ed25519 seed) and the peer id derived from it."""

    seed: bytes = field(repr=False)
    """The RFC 8032 private key: what the key file holds and libp2p's host key is made of."""

    def __post_init__(self) -> None:
        if not isinstance(self.seed, bytes) or len(self.seed) != 32:
            raise ValueError("an Ed25519 seed is 32 bytes")

    @classmethod
    def generate(cls) -> Identity:
        return cls(os.urandom(32))

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        return cls(bytes(seed))

    @functools.cached_property
    def _keypair(self) -> tuple[bytes, bytes]:
        """libsodium's (32-byte public key, 64-byte secret key: seed and public key)."""
        return crypto_sign_seed_keypair(self.seed)

    @property
    def public_bytes(self) -> bytes:
        return self._keypair[0]

    @functools.cached_property
    def peer_id(self) -> str:
        return peer_id_from_public_bytes(self.public_bytes)

    def sign(self, message: bytes) -> bytes:
        return crypto_sign(bytes(message), self._keypair[1])[:64]


def write_key_file(
    path: Path, identity: Identity | None = None, *, overwrite: bool = False
) -> Identity:
    """Create a 0600 key file holding a (new) identity's seed; refuse to clobber one."""
    identity = identity or Identity.generate()
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path}: key file already exists; refusing to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, identity.seed.hex().encode() + b"\n")
    finally:
        os.close(fd)
    return identity


def load_key_file(path: Path) -> Identity:
    """Load an identity; refuse files that others can read or that hold no valid seed."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: key file not found; create one with `swarm keygen {path}`")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{path}: key file is readable by others (mode {mode:o}); run `chmod 600 {path}`"
        )
    text = path.read_text().strip()
    try:
        seed = bytes.fromhex(text)
        return Identity.from_seed(seed)
    except ValueError:
        raise ConfigError(f"{path}: not a swarm key file (expected 64 hex characters)") from None


def load_or_create_key_file(path: Path) -> Identity:
    path = Path(path)
    if path.exists():
        return load_key_file(path)
    return write_key_file(path)
