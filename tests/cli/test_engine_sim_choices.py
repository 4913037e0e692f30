"""`pdorch engine sim`'s Literal choices stay the enums' values (pdorch/cli/engine_sim.py types
them as Literals so that `pdorch --help` need not import `transfer`)."""

from __future__ import annotations

from typing import get_args

from typer.testing import CliRunner

from pdorch.cli import app
from pdorch.cli.engine_sim import KvTransportName, RoleName
from pools.roles import EngineRole
from transfer.transports import KvTransport


def test_the_choices_are_the_enums_values() -> None:
    assert set(get_args(RoleName)) == {r.value for r in EngineRole}
    assert set(get_args(KvTransportName)) == {t.value for t in KvTransport}


def test_a_bad_choice_names_the_flag() -> None:
    result = CliRunner().invoke(app, ["engine", "sim", "--kv-transport", "carrier-pigeon"])
    assert result.exit_code == 2
    assert "--kv-transport" in result.output and "carrier-pigeon" in result.output
