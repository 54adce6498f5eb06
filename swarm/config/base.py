"""The base of every config model: unknown keys are errors, models are frozen.

`refuse_idle` is how a section refuses settings that would do nothing (issue 34): a
knob that only matters when another is on, set while that one is off, is an error at
load time naming the knob and the fix, never a silent no-op.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def non_default(model: BaseModel, *names: str) -> list[str]:
    """Those of the fields `names` whose value differs from the field's default."""
    fields = type(model).model_fields
    return [
        name
        for name in names
        if getattr(model, name) != fields[name].get_default(call_default_factory=True)
    ]


def _shown(value: Any) -> str:
    """A value as the TOML file would write it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else repr(value)


def refuse_idle(model: BaseModel, names: tuple[str, ...], unless: str) -> None:
    """Raise `ValueError` if any of the fields `names` is set away from its default:
    they do nothing unless `unless` (a condition the caller has found false)."""
    idle = non_default(model, *names)
    if idle:
        settings = ", ".join(f"{name} = {_shown(getattr(model, name))}" for name in idle)
        verb = "does" if len(idle) == 1 else "do"
        raise ValueError(
            f"{settings} {verb} nothing unless {unless}: set that, or delete {' and '.join(idle)}"
        )
