"""Every `pdorch` command keeps the CLI conventions of docs/CONVENTIONS.md ("CLI"), checked on the
real command tree (what `--help` shows), so a new option that breaks one fails here."""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from pdorch.cli import app


@dataclass(frozen=True)
class Cmd:
    path: str  # e.g. "bench sim"
    callback: Callable[..., Any]
    click: Any  # the click command typer built


def _walk(typer_app: typer.Typer, click_group: Any, prefix: str = "") -> Iterator[Cmd]:
    for info in typer_app.registered_commands:
        assert info.name is not None and info.callback is not None
        yield Cmd(f"{prefix}{info.name}", info.callback, click_group.commands[info.name])
    for group in typer_app.registered_groups:
        assert group.name is not None and group.typer_instance is not None
        yield from _walk(
            group.typer_instance, click_group.commands[group.name], f"{prefix}{group.name} "
        )


COMMANDS = list(_walk(app, get_command(app)))
IDS = [c.path for c in COMMANDS]


def _options(cmd: Cmd) -> list[Any]:
    return [p for p in cmd.click.params if p.param_type_name == "option" and p.name != "help"]


def _names(option: Any) -> list[str]:
    return [*option.opts, *option.secondary_opts]


def test_the_walk_sees_every_command() -> None:
    assert set(IDS) == {
        "serve",
        "profile",
        "dev tiny-model",
        "engine vllm",
        "engine sim",
        "bench transfer",
        "bench router",
        "bench sim",
        "bench live",
        "bench proxy",
        "bench autoscale",
        "bench chaos",
        "bench soak",
        "plan",
        "autoscale",
        "scale status",
        "scale set",
        "scale auto",
        "scale move",
    }


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_output_paths_are_named_out(cmd: Cmd) -> None:
    for option in _options(cmd):
        for name in _names(option):
            assert not re.search(r"^--(output|out-|report)", name), f"{cmd.path} {name}: use --out"
    outs = [o for o in _options(cmd) if "--out" in o.opts]
    for out in outs:  # the help says whether it is a file or a directory
        assert re.search(r"\b(File|Directory)\b", out.help), f"{cmd.path} --out: file or dir?"


# A unit suffix and what the help text must then say; and the reverse: a help text that gives a
# quantity in one of these units needs the suffix (ratios excepted).
UNITS = {
    "-s": r"\b[Ss]econds?\b",
    "-ms": r"\bms\b",
    "-gib": r"\bGiB\b",
    "-mib": r"\bMiB\b",
    "-kib": r"\bKiB\b",
    "-bytes": r"\bbytes\b",
}
RATIOS = {"--time-scale", "--rate-scale"}  # seconds per second, a multiplier: no unit


def _is_number(cmd: Cmd, option: Any) -> bool:
    hint = typing.get_type_hints(cmd.callback)[option.name]
    return set(typing.get_args(hint) or (hint,)) - {type(None)} <= {int, float}


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_units_are_in_the_flag_names(cmd: Cmd) -> None:
    for option in _options(cmd):
        name = option.opts[0]
        assert not name.endswith("-gb"), f"{cmd.path} {name}: memory sizes are GiB (2^30)"
        suffix = next((s for s in UNITS if name.endswith(s)), None)
        if suffix is not None:
            assert re.search(UNITS[suffix], option.help), f"{cmd.path} {name}: help names no unit"
        elif name not in RATIOS and _is_number(cmd, option):
            for unit, pattern in UNITS.items():
                assert not re.search(pattern, option.help), (
                    f"{cmd.path} {name} carries {unit} but its name does not say so"
                )


MODEL_FLAGS = {
    "--model-profile": "profile",  # a timing model, `pdorch profile`
    "--model-dir": "directory",  # weights on disk, vLLM's --model
    "--served-model-name": "name",  # what clients put in "model"
}


def test_model_flags_keep_one_meaning_each() -> None:
    for cmd in COMMANDS:
        for option in _options(cmd):
            for name in _names(option):
                assert name != "--model", f"{cmd.path}: --model is ambiguous, see MODEL_FLAGS"
                if "model" in name and name in MODEL_FLAGS:
                    assert MODEL_FLAGS[name] in option.help.lower(), f"{cmd.path} {name}"


def test_engines_do_not_default_to_the_coordinator_port() -> None:
    ports = {
        c.path: next(o.default for o in _options(c) if o.name == "port")
        for c in COMMANDS
        if c.path.startswith("engine ")
    }
    assert ports == {"engine sim": 0, "engine vllm": 0}  # 0: a free port, on the ready line


PASS_THROUGH = {"--param", "--vllm-arg"}  # values may hold commas: repeat only


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_list_options_take_commas_and_repeat(cmd: Cmd) -> None:
    for option in _options(cmd):
        name = option.opts[0]
        if option.multiple and name in PASS_THROUGH:
            assert "repeat" in option.help and "never split" in option.help, name
        elif option.multiple:
            assert "comma-separated or repeated" in option.help, f"{cmd.path} {name}"
            assert (option.metavar or "").endswith(",..."), f"{cmd.path} {name}: metavar A,..."
        else:
            assert "comma" not in option.help.lower(), f"{cmd.path} {name}: a list: multiple"


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_help_teaches(cmd: Cmd) -> None:
    doc = inspect.getdoc(cmd.callback) or ""
    assert f"Example: `pdorch {cmd.path}" in doc, f"{cmd.path}: docstring without an example"
    for option in _options(cmd):
        name = option.opts[0]
        assert option.help, f"{cmd.path} {name}: no help"
        shown = option.required or option.is_flag or option.default not in (None, [], ())
        shown = shown or name in PASS_THROUGH  # none given: none passed
        if not shown:  # typer shows no default, so the help must say what happens without it
            says = re.search(r"default|without it|give this|exclusive|instead", option.help, re.I)
            assert says, f"{cmd.path} {name}: say what happens without it"


@pytest.mark.parametrize("cmd", COMMANDS, ids=IDS)
def test_commands_with_tables_have_json(cmd: Cmd) -> None:
    source = Path(inspect.getfile(cmd.callback)).read_text()
    if "Table(" in source:
        json_opt = [o for o in _options(cmd) if "--json" in o.opts]
        assert json_opt and json_opt[0].is_flag, f"{cmd.path}: prints a table, has no --json"
        assert "stdout" in json_opt[0].help


def test_old_spellings_still_work_and_say_the_new_name(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["profile", "--model", "tiny", "--gpu", "cpu", "--kv-memory-gb=1", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["kv_memory_bytes_per_gpu"] == 2**30  # GiB, as documented
    assert "--model is deprecated" in result.stderr and "--model-profile" in result.stderr
    assert "use --kv-memory-gib" in result.stderr


def test_old_spellings_are_hidden_and_point_at_real_options() -> None:
    from pdorch.cli import (
        bench_live,
        bench_proxy,
        bench_router,
        bench_sim,
        engine_sim,
        engine_vllm,
        profile,
    )

    modules = {
        "bench live": bench_live,
        "bench proxy": bench_proxy,
        "bench router": bench_router,
        "bench sim": bench_sim,
        "engine sim": engine_sim,
        "engine vllm": engine_vllm,
        "profile": profile,
    }
    by_path = {c.path: c for c in COMMANDS}
    for path, module in modules.items():
        names = {n for o in _options(by_path[path]) for n in _names(o)}
        for old, new in module.RENAMED.items():
            assert new in names and old not in names, (path, old, new)


REPO = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"pdorch ((?:bench|engine|dev) [a-z-]+|profile|serve)\b([^`\n|\"]*)")


def _recorded_commands() -> Iterator[tuple[str, str, str]]:
    """(file, command path, arguments) of every `pdorch ...` written in the docs and results."""
    files = [REPO / "README.md", REPO / "Makefile"]
    for pattern in ("*.md", "*.yaml", "*.json"):
        for top in ("docs", "benchmarks", "deploy", "pdorch", "pools", "router", "transfer"):
            files += sorted((REPO / top).rglob(pattern))
    for path in files:
        text = path.read_text(errors="replace").replace("\\\n", " ")
        for match in COMMAND.finditer(text):
            yield str(path.relative_to(REPO)), match.group(1), match.group(2)


def test_recorded_commands_use_current_flags() -> None:
    """A command written in a README or recorded beside a result runs as written: each of its
    flags is an option of that command today (deprecated spellings do not count)."""
    by_path = {c.path: c for c in COMMANDS}
    seen = 0
    for where, path, args in _recorded_commands():
        names = {n for o in _options(by_path[path]) for n in _names(o)} | {"--help"}
        for flag in re.findall(r"(?:^|\s)(--[a-z][a-z0-9-]*)", args):
            assert flag in names, f"{where}: `pdorch {path} ... {flag}` is no option of it"
            seen += 1
    assert seen > 50  # the walk found the recorded commands


def test_list_values_split_at_commas_and_concatenate_over_repeats() -> None:
    from pdorch.cli.options import split_ints, split_list

    assert split_list(["a,b", " c ", "d,,"], "--x") == ["a", "b", "c", "d"]
    assert split_ints(["1,32", "64"], "--x") == [1, 32, 64]
    for bad in ([], [","], ["1,x"]):
        with pytest.raises(typer.BadParameter):
            split_ints(bad, "--x")


def test_the_fleet_launcher_speaks_the_current_engine_sim_flags() -> None:
    """`pools.launch` builds `pdorch engine sim` command lines from the settings' field names;
    each flag it emits must be a current option, not a deprecated spelling."""
    from pools.launch_engines import sim_cli_args
    from pools.launch_spec import SimLaunchSpec
    from pools.roles import EngineRole

    spec = SimLaunchSpec(kind="sim", kv_memory_gb=1.5, num_blocks=64, tokenizer="/t")
    args = sim_cli_args(spec, role=EngineRole.DECODE, served_model_name="m", block_size=16)
    flags = {a for a in args if a.startswith("--")}
    engine_sim = next(c for c in COMMANDS if c.path == "engine sim")
    names = {n for o in _options(engine_sim) for n in _names(o)}
    assert {"--kv-memory-gib", "--side-channel-host", "--side-channel-port"} <= flags
    assert flags <= names, flags - names


def test_tiny_model_still_takes_its_directory_as_an_argument(tmp_path: Path) -> None:
    # --seed -1 stops it after parsing: the old positional DIR must parse as --out DIR.
    result = CliRunner().invoke(app, ["dev", "tiny-model", str(tmp_path / "m"), "--seed", "-1"])
    assert result.exit_code == 2
    assert "use --out DIR" in result.stderr
    assert "--seed" in result.stderr and "extra argument" not in result.stderr
    assert not (tmp_path / "m").exists()
