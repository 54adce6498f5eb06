"""How the `swarm` command line looks and fails: typer classes whose `--help` shows no
`<bool>` placeholder, the consoles it prints to, and `user_errors`.

Invariants:
- A user mistake (`ConfigError`) prints one line per message line starting with
  `error:` and exits with status 2; failed training ranks (`RanksFailed`) print one
  `error:` line and exit with status 1; never a traceback.
- Output that is piped or logged is not cut at rich's 80 columns (`PIPED_WIDTH`).
- Every command and group, ours or a plugin's (`flag_help_everywhere`), lists `--help`
  without a placeholder.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
import typer.core
from rich.console import Console

from swarm.errors import ConfigError, RanksFailed


def _flag_help(option: Any) -> Any:
    """Typer lists its `--help` flag with a `<bool>` placeholder, which a user then types
    (`--help 1` is refused): shown without one, as our other flags are."""
    if option is not None:
        option.metavar = ""
    return option


class Command(typer.core.TyperCommand):
    def get_help_option(self, ctx: Any) -> Any:
        return _flag_help(super().get_help_option(ctx))


class Group(typer.core.TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:
        return _flag_help(super().get_help_option(ctx))


class SwarmTyper(typer.Typer):
    """`typer.Typer` whose commands and groups are `Command`s and `Group`s."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=Group, **kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        return super().command(*args, cls=kwargs.pop("cls", Command), **kwargs)


# Piped or logged output is not cut at rich's default of 80 columns (a terminal's width
# is used where there is one).
PIPED_WIDTH = 160
console = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)
err = Console(stderr=True, width=None if sys.stderr.isatty() else PIPED_WIDTH)

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            for line in str(exc).splitlines():
                err.print(f"[red]error:[/red] {line}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except RanksFailed as exc:
            err.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def flag_help_everywhere(typer_app: typer.Typer) -> None:
    """Groups and commands a plugin mounted with plain `typer.Typer`s show `--help` as
    ours do (without a `<bool>` placeholder)."""

    def ours(cls: Any, mine: type) -> Any:  # typer's defaults (or a placeholder): ours
        plain = (typer.core.TyperGroup, typer.core.TyperCommand)
        return mine if not isinstance(cls, type) or cls in plain else cls

    for group in typer_app.registered_groups:
        group.cls = ours(group.cls, Group)
        sub = group.typer_instance
        if sub is not None:
            sub.info.cls = ours(sub.info.cls, Group)
            for command in sub.registered_commands:
                command.cls = ours(command.cls, Command)
            flag_help_everywhere(sub)
