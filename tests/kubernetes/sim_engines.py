"""Simulated engines as real processes standing in for engine pods (their "podIP" is 127.0.0.1).

Each `SimPodEngine` is `pdorch engine sim` on free ports: HTTP (`port`) and a bound KV-event
publisher on `tcp://*:<kv_events_port>`, as an engine container in a pod binds it. `annotations`
are what the pod carries so discovery maps it to these ports (`pools.kubernetes.pods`).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import httpx

from pools.kubernetes.pods import PORT_ANNOTATIONS
from tests.ports import free_ports
from tests.sim_process import PDORCH, stop_process
from tests.waiting import wait_until

TOPIC = "kv-events"
MODEL = "sim-model"


class SimPodEngine:
    def __init__(
        self, log_path: Path, role: str = "both", time_scale: float = 0.1, model: str = MODEL
    ) -> None:
        self.port, self.kv_events_port = free_ports(2)
        self._log = log_path.open("wb")
        args = [
            "engine", "sim", "--role", role, "--port", str(self.port),
            "--time-scale", str(time_scale), "--kv-transport", "none",
            "--kv-events-endpoint", f"tcp://*:{self.kv_events_port}",
            "--kv-events-topic", TOPIC, "--served-model-name", model,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            [*PDORCH, *args],
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def annotations(self) -> dict[str, str]:
        return {
            PORT_ANNOTATIONS["port"]: str(self.port),
            PORT_ANNOTATIONS["kv_events_port"]: str(self.kv_events_port),
        }

    def wait_ready(self, timeout: float = 120.0) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine sim exited with {self.proc.returncode}")
            try:
                return httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout, interval=0.1, message=f"sim engine on {self.url}")

    def stop(self) -> None:
        stop_process(self.proc)
        self._log.close()
