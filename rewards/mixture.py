"""A node's own task stream: a weighted mixture of sources drawn by a cursor.

Invariants:
- Draw k (k = 0, 1, 2, ...) is a pure function of (stream seed, k, mixture): its source is
  a weighted choice by `random.Random("swarm-mix:<stream seed>:<k>")` and its reference is
  `TaskRef(source, stream_seed, k)` while k is within the source's `max_index`. Beyond it
  (reasoning-gym datasets whose index is capped) the reference wraps: with
  `n = max_index + 1`, it is `TaskRef(source, epoch_seed(stream_seed, k // n), k % n)`,
  where epoch 0 is the stream seed itself (so streams within the cap are unchanged).
  Drawing 3 then 5 equals drawing 8.
- The stream seed is `blake2b("<tasks.seed>:<node_seed>")` (63 bits): two nodes with the
  same config but different node seeds get different tasks; the same node after a
  restart gets the same ones.
- `state_dict()` is the cursor and the stream seed; `load_state_dict` refuses a state
  from another stream (a resume with a changed seed would silently repeat tasks).
- Every source of the mixture is resolved at construction (unknown names fail early).
  A reasoning-gym source with options is registered and referenced by its variant name
  (`wire_source`, `rewards.rg.variant_name`), so its options travel with every reference.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import random
from itertools import accumulate

from rewards.tasks import RG_PREFIX, get_source
from swarm.config.tasks import TasksConfig, TaskSpec
from swarm.messages import TaskRef


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of a capped source's references in wrap `epoch` (0: `seed` itself)."""
    if epoch == 0:
        return seed
    digest = hashlib.blake2b(f"swarm-epoch:{seed}:{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def stream_seed(tasks_seed: int, node_seed: int) -> int:
    """The seed a node's task references carry."""
    digest = hashlib.blake2b(f"{tasks_seed}:{node_seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def wire_source(spec: TaskSpec) -> str:
    """The source name references of `spec` carry (registering a reasoning-gym variant)."""
    if not spec.options:
        return spec.source
    from rewards import rg

    return rg.register_variant(spec.source[len(RG_PREFIX) :], spec.options)


Variants = tuple[tuple[str, str], ...]
"""(dataset, canonical options JSON) pairs: hashable, picklable, equal for equal options."""


def variants(config: TasksConfig) -> Variants:
    """Every reasoning-gym variant in the mixture, for processes that must serve them too
    (re-scoring workers)."""
    found = []
    for spec in config.mixture:
        if spec.options:
            opts = json.dumps(spec.options, sort_keys=True, separators=(",", ":"))
            found.append((spec.source[len(RG_PREFIX) :], opts))
    return tuple(found)


def register_variants(found: Variants) -> None:
    """Serve the given variants in this process (idempotent)."""
    if found:
        from rewards import rg

        for dataset, opts in found:
            rg.register_variant(dataset, json.loads(opts))


class TaskStream:
    """Deterministic task references for one node; checkpointable by its cursor."""

    def __init__(self, config: TasksConfig, node_seed: int) -> None:
        if config.seed is None or node_seed is None:
            raise ValueError(
                "a task stream needs tasks.seed and model.seed: derive unset ones from the "
                "node's key first (`NodeConfig.with_node_seeds`)"
            )
        self._sources = [wire_source(spec) for spec in config.mixture]
        self._max_index = {name: get_source(name).max_index for name in self._sources}
        self._cumulative = list(accumulate(spec.weight for spec in config.mixture))
        self.seed = stream_seed(config.seed, node_seed)
        self.cursor = 0

    def _source_at(self, k: int) -> str:
        if len(self._sources) == 1:
            return self._sources[0]
        x = random.Random(f"swarm-mix:{self.seed}:{k}").random() * self._cumulative[-1]
        return self._sources[min(bisect.bisect_right(self._cumulative, x), len(self._sources) - 1)]

    def next_refs(self, n: int) -> list[TaskRef]:
        """The next `n` references; advances the cursor by `n`."""
        if n < 0:
            raise ValueError("n must be >= 0")
        refs = [self._ref_at(k) for k in range(self.cursor, self.cursor + n)]
        self.cursor += n
        return refs

    def _ref_at(self, k: int) -> TaskRef:
        source = self._source_at(k)
        span = self._max_index[source] + 1
        return TaskRef(source, epoch_seed(self.seed, k // span), k % span)

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("seed") != self.seed:
            raise ValueError(
                f"task stream state is for stream seed {state.get('seed')}, this stream has "
                f"{self.seed} (tasks.seed or the node seed changed since the checkpoint)"
            )
        cursor = state.get("cursor")
        if isinstance(cursor, bool) or not isinstance(cursor, int) or cursor < 0:
            raise ValueError(f"bad task stream cursor {cursor!r}")
        self.cursor = cursor
