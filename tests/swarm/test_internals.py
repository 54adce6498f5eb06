"""`swarm.internals`: the checks each library self-check is built from (issue 34)."""

from __future__ import annotations

import logging
import types
from importlib.metadata import version

import pytest

import swarm.internals as internals
from swarm.internals import (
    DEGRADED,
    LibraryInternalsChanged,
    Reaches,
    code_names,
    degraded,
    installed_version,
)


class _Library:
    """A library class as a self-check sees it."""

    def _hook(self, msg: bytes, *, priority: bool = False) -> None:
        return None

    def caller(self) -> None:
        def nested() -> None:
            self._hook(b"")

        nested()


def _reaches() -> Reaches:
    return Reaches("pytest", ("pytest",), "pytest>=8,<9")


def test_installed_version_takes_the_first_installed_distribution() -> None:
    assert installed_version("no-such-distribution-xyz", "pytest") == version("pytest")
    assert installed_version("no-such-distribution-xyz") == "(not installed)"


def test_present_reaches_pass() -> None:
    r = _reaches()
    assert r.attr(_Library, "_hook", "us", params=("msg", "priority")) is not None
    r.calls(_Library, "caller", ("_hook",), "us")  # found in nested code too
    r.attr(_Library(), "caller", "us", kind=types.MethodType)
    r.raise_if_missing()
    assert "_hook" in code_names(_Library.caller)


def test_every_missing_reach_is_named_with_version_and_pin() -> None:
    r = _reaches()
    r.attr(_Library, "_gone", "gossip/a.py")
    r.attr(_Library, "_hook", "gossip/b.py", params=("message",))
    r.calls(_Library, "caller", ("_renamed_hook",), "gossip/c.py")
    r.attr(_Library, "caller", "gossip/d.py", kind=int)
    with pytest.raises(LibraryInternalsChanged) as exc:
        r.raise_if_missing()
    text = str(exc.value)
    assert text.startswith(f"pytest {version('pytest')} (installed): 4 of the internals")
    assert "_Library._gone is missing (used by gossip/a.py)" in text
    assert "_Library._hook takes no parameter message (used by gossip/b.py)" in text
    assert "_Library.caller no longer uses _renamed_hook (used by gossip/c.py)" in text
    assert "_Library.caller is a function, not int (used by gossip/d.py)" in text
    assert "pyproject.toml pins pytest>=8,<9" in text


def test_a_module_global_is_checked_to_be_used_by_the_module() -> None:
    module = types.ModuleType("fake_library")
    exec("def helper():\n    return 1\n\nclass User:\n    def go(self):\n        return helper()\n",
         module.__dict__)  # fmt: skip
    r = _reaches()
    r.module_uses(module, "helper", "us")
    r.raise_if_missing()
    module.User.go = lambda self: 2  # type: ignore[attr-defined]
    module.User.go.__module__ = "fake_library"  # type: ignore[attr-defined]
    r.module_uses(module, "helper", "us")
    assert r.missing == ["no code in fake_library uses its helper any more (used by us)"]


def test_a_degraded_fallback_warns_once_and_counts_every_time(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(internals, "_warned", set())
    before = DEGRADED["pytest"]
    with caplog.at_level(logging.DEBUG, logger="swarm.internals"):
        for _ in range(3):
            degraded("pytest", ("pytest",), "pytest>=8,<9", "no _fast_path: slower")
    assert DEGRADED["pytest"] == before + 3
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert f"pytest {version('pytest')}: no _fast_path: slower" in record.getMessage()
    assert "pins pytest>=8,<9" in record.getMessage()
