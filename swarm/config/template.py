"""Render a commented TOML node config from the config models themselves.

Invariant: the template is generated from the pydantic field docstrings and defaults,
so `swarm init` can never drift from what `load_config` accepts (a test loads it back).
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
        if _is_table_list(value):
            for item in value:
                lines.append(f"[[{name}.{field_name}]]")
                for key, item_value in item.model_dump(mode="json").items():
                    lines.append(f"{key} = {_toml_value(item_value)}")
            continue
        lines.append(f"{field_name} = {_toml_value(value)}")
    return "\n".join([*lines, *("\n" + table for table in subtables)]) + "\n"


def render_config(config: StrictModel, section_notes: dict[str, str] | None = None) -> str:
    """A complete commented config for `config` (every field written out)."""
    notes = section_notes or {}
    parts = [
        "# swarm node configuration. Every key is optional; shown values are the defaults",
        "# unless `swarm init` set them. Check a file with `swarm config check FILE`.",
        "#",
        "# Most nodes set only a handful of these:",
        "#   [node] name, swarm_id        who this node is, which swarm it joins",
        "#   [transport] listen, bootstrap  its port, and one peer it can reach",
        "#   [model] name_or_path         a Hugging Face model id or folder",
        "#   [tasks] mixture              the tasks it samples",
        "#   [sapo] local_groups, external_groups   its own / peers' groups per round",
        "#   [train] learning_rate",
        "# The rest are limits and tuning with defaults that work.",
        "",
    ]
    for name, info in type(config).model_fields.items():
        parts.append(
            render_section(name, getattr(config, name), info.description, notes.get(name, ""))
        )
    return "\n".join(parts)
