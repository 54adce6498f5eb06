"""Random byte mutations of an encoded message, for tests that check two decoders agree."""

from __future__ import annotations

import random
from collections.abc import Sequence


def byte_flips(data: bytes, hot: Sequence[int], count: int, seed: int) -> list[bytes]:
    """`count` copies of `data`, each with 1 to 3 bytes at positions drawn from `hot` set
    to random values (a seeded draw: the same cases every run)."""
    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.choice(hot)] = rng.randrange(256)
        cases.append(bytes(mutated))
    return cases
