"""A simulator speed-up: pure per-message work done once for all simulated receivers.

In one simnet process many nodes receive the very same bytes. Decoding an envelope (its
Ed25519 check included), decoding its payload and re-scoring a rollout group are pure
functions of their arguments, so inside `shared_pure_work()` they are memoized, keyed by
the objects the link model hands to every receiver (the same `bytes` object, whose hash
Python computes once). Each node still runs its whole receive path (seen cache, rate
limit, topic check, staleness, pool); only the simulator's CPU time drops. A test checks
that metrics are byte-identical with and without it.

Invariants:
- Only pure functions are memoized, and their results are immutable (frozen
  dataclasses), so sharing one result between nodes is safe. A `WireError` is never
  cached (the call is simply repeated); a `Refused` re-scoring is cached by its reason
  and raised anew for each caller.
- The patches replace the module attributes the production code looks up at call time
  (`gossip.layer.decode_envelope`, `gossip.layer.decode_payload`,
  `node.workers.rescore_group`) and are always restored on exit, also on error. If one of
  them is gone (the production code moved), entering raises instead of silently running
  unpatched.
- Memory is bounded: each cache is cleared when it reaches `MAX_ENTRIES`.
- Not re-entrant: one `shared_pure_work()` at a time in a process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import gossip.layer
import node.workers
from node.rescore import Refused, Rescored
from swarm.errors import WireError

MAX_ENTRIES = 200_000
_TARGETS = (
    (gossip.layer, "decode_envelope"),
    (gossip.layer, "decode_payload"),
    (node.workers, "rescore_group"),
)
_active = False


class _Canon:
    """Maps equal config objects (each node has its own `Limits` and `RewardsConfig`) to
    one instance, so cache keys compare by identity instead of field by field."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Any, Any]] = {}
        self._by_value: dict[Any, Any] = {}

    def __call__(self, obj: Any) -> Any:
        entry = self._by_id.get(id(obj))
        if entry is not None and entry[0] is obj:
            return entry[1]
        canonical = self._by_value.setdefault(obj, obj)
        self._by_id[id(obj)] = (obj, canonical)  # holds obj, so its id is not reused
        return canonical


def _memo_decode(
    fn: Callable[..., Any], cache: dict[tuple[Any, ...], Any], canon: _Canon, limits_at: int
) -> Callable[..., Any]:
    """A memoized `decode_envelope(data, limits, swarm_id[, refuse_sender])` (`limits_at` 1) or
    `decode_payload(kind, payload, limits)` (`limits_at` 2)."""

    def memoized(first: Any, second: Any, third: Any, *rest: Any) -> Any:
        if limits_at == 1:
            key = (first, canon(second), third)
        else:
            key = (first, second, canon(third))
        try:
            hit = cache[key]
        except KeyError:
            pass
        else:
            # decode_envelope's per-node `refuse_sender` check, applied to a shared result
            # exactly where production applies it (a cached envelope's claimed sender is
            # its verified sender).
            if rest and rest[0] is not None and rest[0](hit.sender):
                raise WireError("ignored_peer", hit.sender[:64])
            return hit
        value = fn(first, second, third, *rest)
        if len(cache) >= MAX_ENTRIES:
            cache.clear()
        cache[key] = value
        return value

    return memoized


def _memo_rescore(
    fn: Callable[..., Rescored], cache: dict[tuple[Any, ...], Any], canon: _Canon
) -> Callable[..., Rescored]:
    by_id: dict[tuple[int, int, tuple[Any, ...]], tuple[Any, Any]] = {}

    def memoized(group: Any, config: Any, variants: tuple[Any, ...] = ()) -> Rescored:
        # Every receiver gets the same group object (decoding is shared), so look it up
        # by identity first: hashing a whole group (prompt and completions) per call
        # cost more than the lookup saved. The entry holds the group, so its id stays
        # unique while the entry lives.
        config = canon(config)
        fast = (id(group), id(config), variants)
        entry = by_id.get(fast)
        if entry is not None and entry[0] is group:
            hit = entry[1]
            if isinstance(hit, str):
                raise Refused(hit)
            return hit
        key = (group, config, variants)
        hit = cache.get(key)
        if hit is None:
            try:
                hit = fn(group, config, variants)
            except Refused as refused:
                hit = refused.reason
            if len(cache) >= MAX_ENTRIES:
                cache.clear()
            cache[key] = hit
        if len(by_id) >= MAX_ENTRIES:
            by_id.clear()
        by_id[fast] = (group, hit)
        if isinstance(hit, str):
            raise Refused(hit)
        return hit

    return memoized


@contextlib.contextmanager
def shared_pure_work() -> Iterator[dict[str, int]]:
    """Memoize the pure receive-path functions while the block runs; yields cache sizes
    (updated on exit) for reporting."""
    global _active
    if _active:
        raise RuntimeError("shared_pure_work is already active")
    originals = []
    for module, name in _TARGETS:
        if not hasattr(module, name):
            raise RuntimeError(f"{module.__name__}.{name} is gone; update simnet.shared")
        originals.append((module, name, getattr(module, name)))
    caches: list[dict[tuple[Any, ...], Any]] = [{} for _ in originals]
    canon = _Canon()
    stats: dict[str, int] = {}
    _active = True
    try:
        for (module, name, original), cache in zip(originals, caches, strict=True):
            if name == "rescore_group":
                memoized = _memo_rescore(original, cache, canon)
            else:
                memoized = _memo_decode(
                    original, cache, canon, 1 if name == "decode_envelope" else 2
                )
            setattr(module, name, memoized)
        yield stats
    finally:
        for module, name, original in originals:
            setattr(module, name, original)
        for (module, name, _), cache in zip(originals, caches, strict=True):
            stats[f"{module.__name__}.{name}"] = len(cache)
        _active = False
