"""The fleet YAML's `discovery:` section for Kubernetes (`kind: kubernetes`), validated.

```yaml
discovery:
  kind: kubernetes
  namespace: pdorch                  # where the engine pods and Deployments live
  api_url: null                      # default: in-cluster (KUBERNETES_SERVICE_HOST/_PORT)
  token_file: null                   # default in-cluster: the service account token
  ca_file: null                      # default in-cluster: the service account CA
  verify_tls: true
  port: 8000                         # the engine's HTTP port (OpenAI API, /health, /metrics)
  kv_events_port: 5557               # the engine's KV-event publisher (it binds tcp://*:PORT)
  kv_events_replay_port: null        # its replay (ROUTER) socket, if any
  kv_events_topic: ""
  side_channel_port: 5600            # NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT)
  role_label: pdorch.io/kv-role      # pods labelled kv_both / both may switch pools
  pool_label: pdorch.io/pool         # the label `switch_role` rewrites
  watch_timeout_s: 300               # server-side timeoutSeconds of one watch
  backoff_initial_s: 0.5             # after an API error: 0.5, 1, 2, ... capped
  backoff_max_s: 30
  drain_timeout_s: 30                # a removed pod's in-flight requests get this long
  pools:
    prefill: {label_selector: "app=vllm,pdorch.io/pool=prefill", deployment: vllm-prefill}
    decode:  {label_selector: "app=vllm,pdorch.io/pool=decode",  deployment: vllm-decode}
```

A pool may override `port`, `kv_events_port`, `kv_events_replay_port`, `side_channel_port`.
`deployment` is what the Kubernetes actuator scales (optional for discovery alone).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POOL_NAMES = ("prefill", "decode", "colocated")
ROLE_AGNOSTIC = frozenset({"kv_both", "both"})


class KubernetesPoolSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    label_selector: str = Field(min_length=1, description="Pods of this pool, e.g. app=vllm,x=y.")
    deployment: str | None = Field(
        default=None, min_length=1, description="What the actuator scales."
    )
    port: int | None = Field(default=None, ge=1, le=65535)
    kv_events_port: int | None = Field(default=None, ge=1, le=65535)
    kv_events_replay_port: int | None = Field(default=None, ge=1, le=65535)
    side_channel_port: int | None = Field(default=None, ge=1, le=65535)


class KubernetesDiscoverySettings(BaseModel):
    """See the module docstring (defaults there)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["kubernetes"]
    namespace: str = Field(default="default", min_length=1)
    api_url: str | None = None
    token_file: Path | None = None
    ca_file: Path | None = None
    verify_tls: bool = True
    port: int = Field(default=8000, ge=1, le=65535)
    kv_events_port: int | None = Field(default=5557, ge=1, le=65535)
    kv_events_replay_port: int | None = Field(default=None, ge=1, le=65535)
    kv_events_topic: str = ""
    side_channel_port: int = Field(default=5600, ge=1, le=65535)
    role_label: str = Field(default="pdorch.io/kv-role", min_length=1)
    pool_label: str = Field(default="pdorch.io/pool", min_length=1)
    watch_timeout_s: int = Field(default=300, ge=1)
    backoff_initial_s: float = Field(default=0.5, gt=0)
    backoff_max_s: float = Field(default=30.0, gt=0)
    drain_timeout_s: float = Field(default=30.0, ge=0)
    pools: dict[str, KubernetesPoolSettings] = Field(min_length=1)

    @field_validator("pools")
    @classmethod
    def _known_pools(
        cls, pools: dict[str, KubernetesPoolSettings]
    ) -> dict[str, KubernetesPoolSettings]:
        for name in pools:
            if name not in POOL_NAMES:
                raise ValueError(f"unknown pool {name!r}; pools: {', '.join(POOL_NAMES)}")
        return pools

    @field_validator("api_url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"must be an http:// or https:// URL, got {url!r}")
        return url

    @model_validator(mode="after")
    def _backoff(self) -> KubernetesDiscoverySettings:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        return self

    def pool(self, name: str) -> KubernetesPoolSettings:
        return self.pools[name]

    def port_of(self, pool: str) -> int:
        return self.pools[pool].port or self.port

    def kv_events_port_of(self, pool: str) -> int | None:
        return self.pools[pool].kv_events_port or self.kv_events_port

    def kv_events_replay_port_of(self, pool: str) -> int | None:
        return self.pools[pool].kv_events_replay_port or self.kv_events_replay_port

    def side_channel_port_of(self, pool: str) -> int:
        return self.pools[pool].side_channel_port or self.side_channel_port

    def resolved_api_url(self) -> str:
        """`api_url`, else the in-cluster address the kubelet puts in every pod's environment."""
        if self.api_url:
            return self.api_url.rstrip("/")
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise RuntimeError(
                "discovery.api_url is not set and KUBERNETES_SERVICE_HOST is not in the "
                "environment (not running in a pod)"
            )
        if ":" in host:  # IPv6
            host = f"[{host}]"
        return f"https://{host}:{port}"

    def resolved_token_file(self) -> Path | None:
        if self.token_file is not None:
            return self.token_file
        default = SERVICE_ACCOUNT / "token"
        return default if default.exists() else None

    def resolved_ca_file(self) -> Path | None:
        if self.ca_file is not None:
            return self.ca_file
        default = SERVICE_ACCOUNT / "ca.crt"
        return default if default.exists() and not self.api_url else None
