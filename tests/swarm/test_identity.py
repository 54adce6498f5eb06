"""Identities: libp2p-compatible peer ids, signatures, and key files kept private."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from swarm.errors import ConfigError, WireError
from swarm.identity import (
    Identity,
    b58decode,
    b58encode,
    load_key_file,
    load_or_create_key_file,
    peer_id_from_public_bytes,
    public_bytes_from_peer_id,
    verify,
    write_key_file,
)


@pytest.mark.parametrize(
    "seed",
    [bytes(32), bytes(range(32)), b"\xff" * 32, b"swarm-test-seed-0123456789abcdef"],
    ids=lambda seed: seed.hex()[:8],
)
def test_peer_id_matches_libp2p(seed: bytes) -> None:
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    expected = ID.from_pubkey(create_new_key_pair(seed).public_key).to_base58()
    identity = Identity.from_seed(seed)
    assert identity.peer_id == expected
    assert identity.peer_id.startswith("12D3KooW")
    assert public_bytes_from_peer_id(identity.peer_id) == identity.public_bytes


def test_generated_identities_differ_and_sign() -> None:
    a, b = Identity.generate(), Identity.generate()
    assert a.peer_id != b.peer_id
    message = b"hello swarm"
    verify(a.peer_id, message, a.sign(message))
    with pytest.raises(WireError) as info:
        verify(b.peer_id, message, a.sign(message))
    assert info.value.reason == "bad_signature"
    with pytest.raises(WireError) as info:
        verify(a.peer_id, message + b"!", a.sign(message))
    assert info.value.reason == "bad_signature"


def test_seed_roundtrip_and_length() -> None:
    identity = Identity.generate()
    assert Identity.from_seed(identity.seed).peer_id == identity.peer_id
    with pytest.raises(ValueError):
        Identity.from_seed(b"short")


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x01", bytes(range(40)), b"\xff" * 7])
def test_base58_roundtrip(data: bytes) -> None:
    assert b58decode(b58encode(data)) == data


@pytest.mark.parametrize(
    "peer_id",
    [
        "",
        "0OIl",  # not base58
        "x" * 65,
        "QmYyQSo1c1Ym7orWxLYvCrM2EmxFTANf8wXmmE7DWjhx5N",  # an RSA-style sha256 multihash
        "12D3KooW",  # right prefix, too short
    ],
)
def test_peer_ids_without_ed25519_key_are_refused(peer_id: str) -> None:
    with pytest.raises(WireError) as info:
        public_bytes_from_peer_id(peer_id)
    assert info.value.reason == "bad_sender"


def test_non_string_peer_id_is_refused() -> None:
    with pytest.raises(WireError):
        public_bytes_from_peer_id(b"12D3KooW")  # type: ignore[arg-type]


def test_key_file_created_0600_and_loaded(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "node.key"
    identity = write_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key_file(path).peer_id == identity.peer_id
    assert load_or_create_key_file(path).peer_id == identity.peer_id


def test_a_key_file_of_an_earlier_version_loads_to_the_same_identity(tmp_path: Path) -> None:
    """Key files are the hex seed and a newline: one written before signing moved
    wholly to libsodium (issue 34) loads to the same peer id and is rewritten byte for
    byte."""
    text = b"000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n"
    path = tmp_path / "old.key"
    path.write_bytes(text)
    path.chmod(0o600)
    identity = load_key_file(path)
    assert identity.peer_id == "12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB"
    write_key_file(tmp_path / "again.key", identity)
    assert (tmp_path / "again.key").read_bytes() == text


def test_the_seed_is_never_in_repr() -> None:
    identity = Identity.from_seed(bytes(range(32)))
    assert identity.seed.hex() not in repr(identity) and "seed" not in repr(identity)


def test_key_file_0600_even_with_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = tmp_path / "node.key"
        write_key_file(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_load_or_create_creates(tmp_path: Path) -> None:
    path = tmp_path / "new.key"
    identity = load_or_create_key_file(path)
    assert path.exists()
    assert load_key_file(path).peer_id == identity.peer_id


def test_key_file_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    first = write_key_file(path)
    with pytest.raises(ConfigError, match="already exists"):
        write_key_file(path)
    assert load_key_file(path).peer_id == first.peer_id


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_key_file_readable_by_others_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "node.key"
    write_key_file(path)
    path.chmod(mode)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_key_file(path)


@pytest.mark.parametrize("content", ["", "not hex at all", "ab" * 31, "ab" * 33, "zz" * 32])
def test_garbage_key_file_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "node.key"
    path.write_text(content)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="not a swarm key file"):
        load_key_file(path)


def test_missing_key_file_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_key_file(tmp_path / "absent.key")


SMALL_ORDER = [
    bytes(32),
    b"\x01" + bytes(31),
    bytes.fromhex("26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05"),
    bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"),
    b"\xec" + b"\xff" * 30 + b"\x7f",
    b"\xed" + b"\xff" * 30 + b"\x7f",
    b"\xee" + b"\xff" * 30 + b"\x7f",
]
SMALL_ORDER += [key[:31] + bytes([key[31] | 0x80]) for key in SMALL_ORDER]


@pytest.mark.parametrize("key", SMALL_ORDER, ids=lambda k: k.hex()[:4] + k.hex()[-2:])
def test_small_order_keys_cannot_be_forged_as(key: bytes) -> None:
    """For these keys OpenSSL accepts R=small point, S=0 on any message: refuse the ids."""
    from nacl.bindings import crypto_core_ed25519_is_valid_point

    assert not crypto_core_ed25519_is_valid_point(key)
    peer_id = peer_id_from_public_bytes(key)
    for r in SMALL_ORDER:
        with pytest.raises(WireError) as info:
            verify(peer_id, b"any message at all", r + bytes(32))
        assert info.value.reason == "bad_sender"


def test_verification_with_a_cached_key_still_checks_every_signature() -> None:
    """The parsed key is cached per peer id; the signature is still checked each time,
    and an id that holds no key is refused each time (never cached as valid)."""
    a = Identity.generate()
    message = b"twice"
    for _ in range(2):
        verify(a.peer_id, message, a.sign(message))
        with pytest.raises(WireError) as info:
            verify(a.peer_id, message + b"!", a.sign(message))
        assert info.value.reason == "bad_signature"
    for _ in range(2):
        with pytest.raises(WireError) as info:
            verify("12D3KooWnot-a-key", message, a.sign(message))
        assert info.value.reason == "bad_sender"
        with pytest.raises(WireError):
            verify(b"12D3KooW", message, a.sign(message))  # type: ignore[arg-type]


@pytest.mark.parametrize("length", [0, 1, 200, 5000])
def test_signatures_are_rfc8032_bytes_and_interoperate_with_openssl(length: int) -> None:
    """Signing runs in libsodium: the bytes must be exactly OpenSSL's (Ed25519 is
    deterministic), each side must accept the other's, and a flipped bit or a signature
    of the wrong length must be refused."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    identity = Identity.from_seed(bytes(range(32)))
    openssl = Ed25519PrivateKey.from_private_bytes(identity.seed)  # a second implementation
    message = os.urandom(length)
    ours = identity.sign(message)
    assert ours == openssl.sign(message)
    openssl.public_key().verify(ours, message)  # OpenSSL accepts ours
    verify(identity.peer_id, message, openssl.sign(message))
    for bad in (
        bytes([ours[0] ^ 1]) + ours[1:],
        ours[:63] + bytes([ours[63] ^ 0x10]),
        ours[:63],
        ours + b"\0",
    ):
        with pytest.raises(WireError) as info:
            verify(identity.peer_id, message, bad)
        assert info.value.reason == "bad_signature"
