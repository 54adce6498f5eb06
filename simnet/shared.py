"""A simulator speed-up: pure per-message work done once for all simulated receivers.

In one simnet process many nodes receive the very same bytes. Decoding an envelope (its
Ed25519 check included), decoding its payload and re-scoring a rollout group are pure
functions of their arguments, so inside `shared_pure_work()` they are memoized, keyed
by the objects the link model hands to every receiver (the same `bytes` object, whose
hash Python computes once). Each node still runs its whole receive path (seen cache,
rate limit, topic check, staleness, pool); only the simulator's CPU time drops. A test
checks that metrics are byte-identical with and without it.

Regenerating a task from its reference (`make_task`) and scoring completions
(`score_group`, one score per distinct completion of a task) are memoized too, so the
first receiver re-scoring a group reuses the scores its sender computed when sampling
it. Only rewards without a time limit are memoized (one that runs out of time scores 0:
not a pure function); the process-wide `rewards.registry.reward_counters` count only
the calls actually made (simnet reports none of them).

Signatures made in this process are not checked again: `Identity.sign` records each
(peer id, signed bytes, signature) it makes, and `swarm.envelope.verify` returns at once
for exactly such a triple. Ed25519 is complete (RFC 8032: a signature made with a key
verifies under that key's public key, which the peer id embeds), so for these triples
the check cannot fail; anything else (a forged or altered signature, other bytes, a
claimed sender that did not sign them) goes through the real check.

Invariants:
- Only pure functions are memoized, and their results are immutable (frozen
  dataclasses, floats; `score_group` returns a fresh list each call), so sharing one
  result between nodes is safe. A `WireError` is never cached (the call is simply
  repeated), nor is any exception of `make_task` or `score_group`; a `Refused`
  re-scoring is cached by its reason and raised anew for each caller.
- The patches replace the attributes the production code looks up at call time
  (`gossip.layer.decode_envelope`, `gossip.layer.decode_payload`,
  `node.workers.rescore_group`, `make_task` and `score_group` in `node.rescore` and
  `simnet.stub`, `swarm.envelope.verify`, `swarm.identity.Identity.sign`) and are
  always restored on exit, also on error. If one of them is gone (the production code
  moved), entering raises instead of silently running unpatched.
- Memory is bounded and does not grow with the run: each cache keeps only its most
  recent entries (`Recent`: between `WINDOW` and 2 x `WINDOW`, `TASK_WINDOW` for
  tasks and scores), which is what is still in use (a message is decoded for all its
  receivers within a second or so; a task is re-scored about one round after its
  sender sampled it). An entry that was dropped is simply computed again. (Keeping
  every entry of a run made the garbage collector walk millions of cached objects:
  most of the cost that grew with nodes x rounds.)
- Not re-entrant: one `shared_pure_work()` at a time in a process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import gossip.layer
import node.rescore
import node.workers
import simnet.stub
import swarm.envelope
from node.rescore import Refused, Rescored
from rewards.registry import get_correctness
from rewards.tasks import get_source
from swarm.errors import WireError
from swarm.identity import Identity

WINDOW = 2048
"""Entries per generation of the caches of messages and signatures (`Recent`): a
message is decoded for all its receivers within about a second of being sent."""
TASK_WINDOW = 8192
"""Entries per generation of the task and score caches: a task is re-scored about one
round after its sender drew it (some 4 tasks x nodes x 5/8 of a round at the benchmark's
settings: 2,500 tasks for 1,000 nodes)."""
_TARGETS: tuple[tuple[Any, str], ...] = (
    (gossip.layer, "decode_envelope"),
    (gossip.layer, "decode_payload"),
    (node.workers, "rescore_group"),
    (node.rescore, "make_task"),
    (simnet.stub, "make_task"),
    (node.rescore, "score_group"),
    (simnet.stub, "score_group"),
    (swarm.envelope, "verify"),
    (Identity, "sign"),
)
_active = False


class Recent:
    """A cache of the most recent entries in two generations: new entries go to the
    young one; when it holds `window` entries it becomes the old one (the previous old
    one is dropped) and a new young one starts; a hit in the old generation moves the
    entry to the young one. So it holds the last `window` to 2 x `window` entries used.
    Values must not be None (None means a miss). Hot callers look in `young` first and
    call `get` only when that misses (the same result, one call less per hit)."""

    __slots__ = ("old", "window", "young")

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window = window
        self.young: dict[Any, Any] = {}
        self.old: dict[Any, Any] = {}

    def __len__(self) -> int:
        return len(self.young) + len(self.old)

    def get(self, key: Any) -> Any:
        value = self.young.get(key)
        if value is None:
            value = self.old.pop(key, None)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key: Any, value: Any) -> None:
        if len(self.young) >= self.window:
            self.old = self.young
            self.young = {}
        self.young[key] = value


class _Canon:
    """Maps equal config objects (each node has its own `Limits` and `RewardsConfig`) to
    one instance, so cache keys compare by identity instead of field by field. Holds
    every canonical object for its own lifetime, so their ids stay unique meanwhile."""

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
    fn: Callable[..., Any], cache: Recent, canon: _Canon, limits_at: int
) -> Callable[..., Any]:
    """A memoized `decode_envelope(data, limits, swarm_id[, refuse_sender],
    signature_checked=...)` (`limits_at` 1) or `decode_payload(kind, payload, limits)`
    (`limits_at` 2). Only results of a full check are kept (a decode that trusted a
    transport's signature check is not shared with callers that did not)."""

    def memoized(first: Any, second: Any, third: Any, *rest: Any, **options: Any) -> Any:
        # Canonical limits live as long as `canon`, so their id stands for their value
        # (hashing a `Limits` dataclass field by field per message cost more).
        if limits_at == 1:
            key = (first, id(canon(second)), third)
        else:
            key = (first, second, id(canon(third)))
        hit = cache.young.get(key)
        if hit is None:
            hit = cache.get(key)
        if hit is not None:
            # decode_envelope's per-node `refuse_sender` check, applied to a shared result
            # exactly where production applies it (a cached envelope's claimed sender is
            # its verified sender).
            if rest and rest[0] is not None and rest[0](hit.sender):
                raise WireError("ignored_peer", hit.sender[:64])
            return hit
        value = fn(first, second, third, *rest, **options)
        if not options.get("signature_checked"):
            cache.put(key, value)
        return value

    return memoized


def _memo_rescore(
    fn: Callable[..., Rescored], cache: Recent, canon: _Canon
) -> Callable[..., Rescored]:
    def memoized(group: Any, config: Any, variants: tuple[Any, ...] = ()) -> Rescored:
        # Every receiver gets the same group object (decoding is shared), so it is looked
        # up by identity: hashing a whole group (prompt and completions) per call cost
        # more than the lookup saved. The entry holds the group, so its id stays unique
        # while the entry lives. (An equal group in another object is re-scored anew.)
        config = canon(config)
        key = (id(group), id(config), variants)
        entry = cache.young.get(key)
        if entry is None:
            entry = cache.get(key)
        if entry is not None and entry[0] is group:
            hit = entry[1]
        else:
            try:
                hit = fn(group, config, variants)
            except Refused as refused:
                hit = refused.reason
            cache.put(key, (group, hit))
        if isinstance(hit, str):
            raise Refused(hit)
        return hit

    return memoized


def _memo_make_task(fn: Callable[..., Any], cache: Recent) -> Callable[..., Any]:
    """A memoized `make_task(ref)` (pure: `rewards.tasks`); errors are not cached."""

    def memoized(ref: Any) -> Any:
        hit = cache.get(ref)
        if hit is None:
            hit = fn(ref)
            cache.put(ref, hit)
        return hit

    return memoized


def _memo_score_group(
    fn: Callable[..., list[float]], cache: Recent, canon: _Canon
) -> Callable[..., list[float]]:
    """A memoized `score_group(task, completions, config)`, one score per distinct
    completion, for rewards without a time limit (a limited reward may score 0 for
    running out of time: not a pure function, so it is always called)."""

    def memoized(task: Any, completions: list[str], config: Any) -> list[float]:
        config = canon(config)
        key = (id(task), id(config))  # canonical configs live on; the entry holds the task
        entry = cache.get(key)
        if entry is None or entry[0] is not task:
            try:
                reward = get_correctness(config.correctness)
                source = get_source(task.ref.source)
            except KeyError:
                return fn(task, completions, config)  # its own error, as without sharing
            slow = source.slow_scoring if reward.slow is None else reward.slow
            entry = (task, None if slow else {})
            cache.put(key, entry)
        scores = entry[1]
        if scores is None:
            return fn(task, completions, config)
        missing = [c for c in dict.fromkeys(completions) if c not in scores]
        if missing:
            scores.update(zip(missing, fn(task, missing, config), strict=True))
        return [scores[c] for c in completions]

    return memoized


def _recording_sign(
    fn: Callable[[Identity, bytes], bytes], made: Recent
) -> Callable[[Identity, bytes], bytes]:
    """`Identity.sign` that records (signature -> (peer id, signed bytes))."""

    def sign(self: Identity, message: bytes) -> bytes:
        signature = fn(self, message)
        made.put(signature, (self.peer_id, message))
        return signature

    return sign


def _skip_own_verify(
    fn: Callable[[str, bytes, bytes], None], made: Recent
) -> Callable[[str, bytes, bytes], None]:
    """`verify` that returns at once for a triple `Identity.sign` made in this process."""

    def verify(peer_id: str, message: bytes, signature: bytes) -> None:
        entry = made.get(signature)
        if entry is not None and entry[0] == peer_id and entry[1] == message:
            return None
        return fn(peer_id, message, signature)

    return verify


@contextlib.contextmanager
def shared_pure_work(window: int | None = None) -> Iterator[dict[str, int]]:
    """Memoize the pure receive-path functions while the block runs (the message caches
    keeping their last `window` (default `WINDOW`) to 2 x `window` entries, the task
    caches at least `TASK_WINDOW`); yields cache sizes (updated on exit)."""
    global _active
    window = WINDOW if window is None else window
    task_window = max(window, TASK_WINDOW)
    if _active:
        raise RuntimeError("shared_pure_work is already active")
    originals = []
    for owner, name in _TARGETS:
        if not hasattr(owner, name):
            raise RuntimeError(f"{owner.__name__}.{name} is gone; update simnet.shared")
        originals.append((owner, name, getattr(owner, name)))
    canon = _Canon()
    caches = {
        "decode_envelope": Recent(window),
        "decode_payload": Recent(window),
        "rescore_group": Recent(window),
        "make_task": Recent(task_window),  # one cache for both patches of each
        "score_group": Recent(task_window),
        "signatures_made": Recent(window),  # written by sign, read by verify
    }
    stats: dict[str, int] = {}
    _active = True
    try:
        for owner, name, original in originals:
            if name == "rescore_group":
                memoized = _memo_rescore(original, caches[name], canon)
            elif name == "make_task":
                memoized = _memo_make_task(original, caches[name])
            elif name == "score_group":
                memoized = _memo_score_group(original, caches[name], canon)
            elif name == "sign":
                memoized = _recording_sign(original, caches["signatures_made"])
            elif name == "verify":
                memoized = _skip_own_verify(original, caches["signatures_made"])
            else:
                limits_at = 1 if name == "decode_envelope" else 2
                memoized = _memo_decode(original, caches[name], canon, limits_at)
            setattr(owner, name, memoized)
        yield stats
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
        stats.update((name, len(cache)) for name, cache in caches.items())
        _active = False
