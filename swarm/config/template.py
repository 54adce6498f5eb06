"""Render a commented TOML node config from the config models themselves.

Invariants:
- The template is generated from the pydantic field docstrings and defaults, so
  `swarm init` can never drift from what `load_config` accepts (a test loads it back).
- Only values that differ from a field's default are written as keys; every default is
  shown commented out (`# key = value`). A written file never holds a second copy of
  the defaults: it gets whatever the config models' defaults are when it is loaded
  (issue 34). A `type` key (the transport's choice) is always written.
- The sections a node usually sets come first (`FIRST_SECTIONS`), the rest below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel

from swarm.config.base import StrictModel


def _toml_value(value: Any) -> str:
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, dict):  # an inline table on one line (tomli_w writes a [section])
        items = ", ".join(f"{k} = {_inline(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    rendered = tomli_w.dumps({"v": value}).strip()
    return rendered[len("v = ") :]


def _inline(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_inline(v) for v in value) + "]"
    return _toml_value(value)


def _comment(text: str | None) -> list[str]:
    if not text:
        return []
    return ["# " + line.strip() if line.strip() else "#" for line in text.strip().splitlines()]


FIRST_SECTIONS = ("node", "transport", "model", "sampler", "tasks", "sapo", "train")
"""Where the handful of keys most nodes set live; rendered before the other sections."""


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and isinstance(value[0], BaseModel)


def _table_rank(value: Any) -> int:
    """0: a plain key; 1: an array of tables; 2: a sub-table (rendered after its section)."""
    if isinstance(value, StrictModel):
        return 2
    return 1 if _is_table_list(value) else 0


def render_section(
    name: str, model: StrictModel, header_doc: str | None, extra_doc: str = ""
) -> str:
    lines = _comment(header_doc)
    if extra_doc:
        lines += _comment(extra_doc)
    lines.append(f"[{name}]")
    fields = list(type(model).model_fields.items())
    # Sub-tables and arrays of tables must follow every plain key of their section.
    fields.sort(key=lambda item: _table_rank(getattr(model, item[0])))
    subtables = []
    for field_name, info in fields:
        value = getattr(model, field_name)
        if isinstance(value, StrictModel):
            subtables.append(render_section(f"{name}.{field_name}", value, info.description))
            continue
        lines += _comment(info.description)
        if value is None:
            lines.append(f"# {field_name} = (unset)")
            continue
        # A default is shown commented out: the file then follows the models' defaults.
        default = info.get_default(call_default_factory=True)
        mark = "" if field_name == "type" or value != default else "# "
        written: list[str] = []
        if _is_table_list(value):
            for item in value:
                written.append(f"[[{name}.{field_name}]]")
                for key, item_value in item.model_dump(mode="json").items():
                    written += f"{key} = {_toml_value(item_value)}".splitlines()
        else:
            written += f"{field_name} = {_toml_value(value)}".splitlines()
        lines += [mark + line for line in written]
    return "\n".join([*lines, *("\n" + table for table in subtables)]) + "\n"


def render_config(config: StrictModel, section_notes: dict[str, str] | None = None) -> str:
    """A complete commented config for `config`: every field, its non-default values
    as keys and its defaults commented out."""
    notes = section_notes or {}
    parts = [
        "# swarm node configuration. Check it with `swarm config check FILE`.",
        "#",
        "# Every key is optional. Keys written without `#` are this node's own settings;",
        "# a commented-out key shows its default (remove the `#` to change it). The",
        "# defaults learn with the built-in model (`builtin:tiny` on the `digit` task), and",
        "# the model and task seeds come from the node's key unless set.",
        "#",
        "# Most nodes set only a handful of these (their sections come first):",
        "#   [node] name, swarm_id        who this node is, which swarm it joins",
        "#   [transport] listen, bootstrap  its port, and one peer it can reach",
        "#   [model] name_or_path         a Hugging Face model id or folder",
        "#   [sampler] max_new_tokens     hundreds for a real model on reasoning tasks",
        "#   [tasks] mixture              the tasks it samples",
        "#   [sapo] local_groups, external_groups   its own / peers' groups per round",
        "#   [train] learning_rate        about 1e-6 for a pretrained 0.1-0.5B model",
        "# The sections after those are limits and tuning with defaults that work.",
        "",
    ]
    fields = type(config).model_fields
    first = [name for name in FIRST_SECTIONS if name in fields]
    rest = [name for name in fields if name not in FIRST_SECTIONS]
    for name in first + rest:
        if rest and name == rest[0]:
            parts.append("# ---- Limits and tuning: the defaults work ----\n")
        info = fields[name]
        parts.append(
            render_section(name, getattr(config, name), info.description, notes.get(name, ""))
        )
    return "\n".join(parts)
