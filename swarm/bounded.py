"""A mapping that holds at most `max_size` entries and forgets its oldest first.

What a node remembers per peer, per message or per key that a peer chooses (sender
versions, seen envelopes, rate-limit buckets, log throttles, ...) must stay bounded
however many keys a flood brings; this is the one helper for that.

Invariants:
- `len(d) <= d.max_size` after every call (`max_size >= 1`).
- Entries are ordered oldest first; iteration, `items()` and eviction follow that order.
- Storing a key that is absent (`d[k] = v`, `d.set(k, v)`, `setdefault`) adds it as
  the newest, then evicts the oldest entry if that makes one too many: at most one
  eviction per store, never of the key just stored. `set` returns the evicted pair.
- Storing a key that is present replaces its value and, by default, makes it the
  newest (the least recently *stored* key is evicted first); with `fifo=True` it keeps
  its place (the first *inserted* key is evicted first).
- Reading (`d[k]`, `get`, `in`, iteration) never changes the order, so a site that
  wants "least recently used" stores the entry again when it uses it.
- Removing (`del`, `pop`, `clear`) never evicts anything else.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import ItemsView, Iterator, KeysView, MutableMapping, ValuesView
from typing import Any, TypeVar, overload

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")
_MISSING: Any = object()


class BoundedDict(MutableMapping[K, V]):
    """At most `max_size` entries; the oldest leaves first (see the module invariants)."""

    __slots__ = ("_data", "fifo", "max_size")

    def __init__(self, max_size: int, *, fifo: bool = False) -> None:
        if max_size < 1:
            raise ValueError(f"max_size must be >= 1, got {max_size}")
        self.max_size = max_size
        self.fifo = fifo
        """True: storing a present key keeps its place (evict in insertion order)."""
        self._data: OrderedDict[K, V] = OrderedDict()

    def set(self, key: K, value: V) -> tuple[K, V] | None:
        """Store `key`; return the (key, value) pair this evicted, if any."""
        data = self._data
        if key in data:
            data[key] = value
            if not self.fifo:
                data.move_to_end(key)
            return None
        data[key] = value
        if len(data) > self.max_size:
            return data.popitem(last=False)
        return None

    def __setitem__(self, key: K, value: V) -> None:
        self.set(key, value)

    def __getitem__(self, key: K) -> V:
        return self._data[key]

    def __delitem__(self, key: K) -> None:
        del self._data[key]

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"BoundedDict({self.max_size}, fifo={self.fifo}, {dict(self._data)!r})"

    # Faster than MutableMapping's generic versions (these run per message).
    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, /, default: V | T) -> V | T: ...
    def get(self, key: K, /, default: Any = None) -> Any:
        return self._data.get(key, default)

    def pop(self, key: K, default: Any = _MISSING) -> Any:
        if default is _MISSING:
            return self._data.pop(key)
        return self._data.pop(key, default)

    def clear(self) -> None:
        self._data.clear()

    def keys(self) -> KeysView[K]:
        return self._data.keys()

    def values(self) -> ValuesView[V]:
        return self._data.values()

    def items(self) -> ItemsView[K, V]:
        return self._data.items()
