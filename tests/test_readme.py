"""The README and the docs, checked without running anything heavy (well under 5 s):
every relative link resolves, every `swarm` command they name exists (and the README's
commands pass only options that exist), and the walkthrough's extraction
(`tests/readme_walkthrough.py`) finds the README's commands. Running them for real is
the walkthrough's job."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from cli.main import app
from tests.readme_walkthrough import (
    extract_commands,
    fill_placeholders,
    runs_until_stopped,
    strip_comment,
    swarm_subcommand,
)

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCED = re.compile(r"^```[\w+-]*\n(.*?)^```", re.M | re.S)
SWARM_USE = re.compile(r"(?:^|[\s/(])swarm((?:\s+(?:-[-\w]+|[a-z][\w-]*))+)")


def relative_links(page: Path) -> list[str]:
    text = FENCED.sub("", page.read_text())
    links = [m.group(1) for m in LINK.finditer(text)]
    return [x for x in links if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", x)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for link in relative_links(page):
        target = (page.parent / link.split("#", 1)[0]).resolve()
        if not target.exists():
            broken.append(link)
    assert not broken, f"{page.relative_to(REPO)}: links to nothing: {broken}"


def code_in(markdown: str) -> list[str]:
    """Inline code spans and the lines of fenced blocks (the places commands are named)."""
    blocks = [m.group(1) for m in FENCED.finditer(markdown)]
    rest = FENCED.sub("", markdown)
    return [*CODE_SPAN.findall(rest), *(line for b in blocks for line in b.splitlines())]


def named_commands(markdown: str) -> set[tuple[str, ...]]:
    """Each `swarm SUB [SUBSUB]` path named in code, e.g. ("config", "check")."""
    found = set()
    for code in code_in(markdown):
        for match in SWARM_USE.finditer(strip_comment(code)):
            words = [w for w in match.group(1).split() if not w.startswith("-")]
            if words:
                found.add(tuple(words[:2]))
    return found


def is_group(command: Any) -> bool:
    return isinstance(getattr(command, "commands", None), dict)


def resolve(path: tuple[str, ...]) -> Any:
    """The (click-like) command `swarm PATH...` runs, going into groups; None if there
    is none."""
    command: Any = typer.main.get_command(app)
    for word in path:
        if not is_group(command):
            return command
        sub = command.commands.get(word)
        if sub is None:
            return None
        command = sub
    return command


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_swarm_command_named_exists(page: Path) -> None:
    named = named_commands(page.read_text())
    if page == README:
        assert {("join",), ("init", "alice"), ("export", "runs")} <= named
    missing = []
    for path in sorted(named):
        command = resolve(path[:1])
        if command is None:
            missing.append(path[0])
        elif is_group(command) and resolve(path) is None:
            missing.append(" ".join(path))
    assert not missing, (
        f"{page.relative_to(REPO)} names swarm commands that do not exist: {missing}"
    )


def test_the_readme_commands_pass_only_options_that_exist() -> None:
    for command in extract_commands(README.read_text()):
        found = swarm_subcommand(command.text)
        if found is None:
            continue
        sub, args = found
        target = resolve((sub, *[a for a in args[:1] if not a.startswith("-")]))
        assert target is not None, f"line {command.line}: no `swarm {sub}`"
        options = {opt for param in target.params for opt in param.opts}
        given = {a.split("=", 1)[0] for a in args if a.startswith("-")}
        assert given <= options, f"line {command.line}: unknown options {given - options}"


def test_the_walkthrough_finds_the_readme_commands() -> None:
    commands = extract_commands(README.read_text())
    texts = [c.text for c in commands]
    assert texts[:2] == ["make demo", "make test"]
    assert ".venv/bin/swarm join -c alice.toml --listen /ip4/127.0.0.1/tcp/4001" in texts
    bob = next(t for t in texts if "bob.toml --listen" in t)
    assert bob.endswith("--bootstrap /ip4/127.0.0.1/tcp/4001/p2p/12D3KooW...")
    assert not any("#" in t or t.endswith("\\") for t in texts)
    assert any(t.startswith(".venv/bin/swarm export runs/bob") for t in texts)
    # The join commands run until stopped; the rest in the foreground.
    assert [runs_until_stopped(t) is not None for t in texts].count(True) == 2
    # Two nodes by hand, then the export once bob stopped: two blocks.
    joins = [c for c in commands if "swarm join" in c.text]
    export = next(c for c in commands if "swarm export" in c.text)
    assert joins[0].block == joins[1].block < export.block


def test_extraction_rules() -> None:
    markdown = "\n".join(
        [
            "```sh",
            "echo one   # a comment",
            "# only a comment",
            "echo 'a # kept' \\",
            "    two",
            "```",
            "```text",
            "not a command",
            "```",
            "```toml",
            'key = "value"',
            "```",
            "```sh",
            "swarm join -c a.toml --bootstrap /ip4/1.2.3.4/tcp/1/p2p/12D3KooW...",
            "```",
        ]
    )
    commands = extract_commands(markdown)
    assert [(c.block, c.line, c.text) for c in commands] == [
        (0, 2, "echo one"),
        (0, 4, "echo 'a # kept' two"),
        (1, 14, "swarm join -c a.toml --bootstrap /ip4/1.2.3.4/tcp/1/p2p/12D3KooW..."),
    ]
    assert shlex.split(commands[1].text) == ["echo", "a # kept", "two"]
    filled = fill_placeholders(commands[2].text, {"/ip4/1.2.3.4/tcp/1": "12D3KooWabc"}, None)
    assert filled.endswith("/ip4/1.2.3.4/tcp/1/p2p/12D3KooWabc")
    assert fill_placeholders("peer 12D3KooW...", {}, "12D3KooWxyz") == "peer 12D3KooWxyz"
