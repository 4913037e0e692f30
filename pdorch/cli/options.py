"""The CLI's shared option conventions (docs/CONVENTIONS.md, "CLI"): list values, deprecated
flag spellings.

- A list option takes comma-separated values and may be repeated; the lists concatenate
  (`--policies a,b --policies c` is `a,b,c`). Options whose values are opaque (`--param KEY=VALUE`
  with a JSON value, `--vllm-arg` verbatim) only repeat, since a value may hold a comma.
- A renamed flag keeps its old spelling for one release as a hidden alias: the command's class
  rewrites it before click parses and says so on stderr, so old scripts run and learn the new name.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from typing import Any

import typer
from typer.core import TyperCommand


def split_list(values: Iterable[str] | None, option: str) -> list[str]:
    """The items of a list option: every occurrence split at commas, blanks dropped, in order."""
    items = [part.strip() for value in values or () for part in value.split(",")]
    items = [item for item in items if item]
    if not items:
        raise typer.BadParameter("give at least one value", param_hint=option)
    return items


def split_ints(values: Iterable[str] | None, option: str) -> list[int]:
    """`split_list` for integer lists (e.g. `--concurrency 1,32`)."""
    try:
        return [int(item) for item in split_list(values, option)]
    except ValueError:
        raise typer.BadParameter(
            f"not a list of integers: {','.join(values or ())!r}", param_hint=option
        ) from None


def renamed(old_to_new: Mapping[str, str]) -> type[TyperCommand]:
    """A command class accepting each old flag spelling as a hidden alias of its new name.

    Rewrites `--old` and `--old=VALUE` up to a bare `--`, saying so on stderr each time;
    `--help` lists only the new names.
    """
    aliases = dict(old_to_new)

    class RenamedFlagsCommand(TyperCommand):
        def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
            # ctx: Any because typer's click Context is private (typer vendors click).
            rewritten: list[str] = []
            for i, arg in enumerate(args):
                if arg == "--":
                    rewritten.extend(args[i:])
                    break
                name, sep, value = arg.partition("=")
                new = aliases.get(name)
                if new is not None:
                    print(
                        f"{ctx.command_path}: {name} is deprecated (one more release); use {new}",
                        file=sys.stderr,
                    )
                    arg = f"{new}{sep}{value}"
                rewritten.append(arg)
            return super().parse_args(ctx, rewritten)

    return RenamedFlagsCommand
