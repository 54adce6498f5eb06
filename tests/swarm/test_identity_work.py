"""`swarm.identity_work`: proof of work on a key, bound to its swarm."""

from __future__ import annotations

import pytest

from swarm.identity_work import (
    MAX_BITS,
    PROGRESS_EVERY,
    has_work,
    leading_zero_bits,
    mint,
    mint_seconds,
    work_digest,
)

SWARM, KEY = "swarm-demo", "12D3KooWExampleKeyForWork"


def test_leading_zero_bits_counts_across_bytes() -> None:
    assert leading_zero_bits(b"\x80" + b"\x00" * 31) == 0
    assert leading_zero_bits(b"\x01" + b"\x00" * 31) == 7
    assert leading_zero_bits(b"\x00\x00\x10" + b"\xff" * 29) == 19
    assert leading_zero_bits(b"\x00" * 32) == 256


def test_mint_finds_the_smallest_nonce_with_the_work_and_resumes_past_it() -> None:
    nonce = mint(SWARM, KEY, 10)
    assert has_work(SWARM, KEY, nonce, 10)
    assert all(leading_zero_bits(work_digest(SWARM, KEY, n)) < 10 for n in range(nonce))
    later = mint(SWARM, KEY, 10, start=nonce + 1)
    assert later > nonce and has_work(SWARM, KEY, later, 10)


def test_work_is_bound_to_its_swarm_and_key() -> None:
    nonce = mint(SWARM, KEY, 12)
    assert has_work(SWARM, KEY, nonce, 12)
    # Another swarm or key: the same nonce is worth 12 bits by chance only (1 in 4,096).
    assert not has_work("another-swarm", KEY, nonce, 12)
    assert not has_work(SWARM, KEY + "x", nonce, 12)


def test_no_work_asked_is_always_met_and_a_missing_or_bad_nonce_never_is() -> None:
    assert has_work(SWARM, KEY, None, 0)
    assert not has_work(SWARM, KEY, None, 1)
    assert not has_work(SWARM, KEY, -1, 1)
    assert not has_work(SWARM, KEY, 2**64, 1)


def test_mint_reports_progress_and_refuses_more_bits_than_allowed() -> None:
    seen: list[int] = []

    class Stop(Exception):
        pass

    def progress(hashes: int) -> None:
        seen.append(hashes)
        raise Stop

    with pytest.raises(Stop):
        mint(SWARM, KEY, MAX_BITS, on_progress=progress)
    assert seen == [PROGRESS_EVERY]
    with pytest.raises(ValueError):
        mint(SWARM, KEY, MAX_BITS + 1)
    assert mint_seconds(20, 2**20) == 1.0
