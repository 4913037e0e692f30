"""Fixtures: the fake Kubernetes API server (tests/kube_apiserver.py) and engine "pods"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kube_apiserver import FakeKubeApiServer
from tests.kubernetes.sim_engines import SimPodEngine

TOKEN = "k8s-test-token"
NAMESPACE = "pdorch"


@pytest.fixture
def kube() -> Iterator[FakeKubeApiServer]:
    with FakeKubeApiServer(token=TOKEN, namespace=NAMESPACE, bookmark_interval_s=0.2) as fake:
        yield fake


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="session")
def sim_pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SimPodEngine]]:
    """Three simulated engines (role both) shared by every test here: the pods' containers."""
    logs = tmp_path_factory.mktemp("sim-pods")
    engines = [SimPodEngine(logs / f"engine-{i}.log") for i in range(3)]
    try:
        for engine in engines:
            engine.wait_ready()
        yield engines
    finally:
        for engine in engines:
            engine.stop()
