"""The fleet file: which engines serve which pool, how requests are routed between them.

```yaml
served_model_name: llama-3.1-8b
block_size: 16
pools:
  prefill: {policy: {name: token_load}, launch: [{kind: sim, count: 2, model_profile: ...}]}
  decode:  {policy: {name: token_load_decode}, endpoints: [{url: http://10.0.0.7:8000}]}
pd: {min_uncached_tokens: 512}
tokenizer: {mode: engine}
coordinator: {request_timeout_s: 600, api_keys: [...], admin_token: ...}
```

Every section is a pydantic model with `extra="forbid"`, so a typo is an error, and every
error names its field path (`pools.decode.endpoints[1].url`); `load_fleet_config` adds the file
and line. Cross-field rules (policy names/params/weights, a vLLM spec's block size on CPU,
unique replica ids, at least one pool that can serve; `fleet_rules.py`) are checked at load
time too, so a bad file fails before any engine starts. Full reference: `pools/FLEET_API.md`;
examples: `deploy/examples/fleet-*.yaml`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from pdorch.config.coordinator import AdmissionSettings, CoordinatorSettings
from pdorch.config.fleet_model import (
    MODEL_KEYS,
    POOL_NAMES,
    FleetTokenizerConfig,
    ModelConfig,
    PoolConfig,
    PoolsConfig,
    resolve_model_paths,
)
from pdorch.config.fleet_rules import FleetFieldError, check_model
from pdorch.sync.settings import SyncSettings
from pools.health import HealthSettings
from pools.kubernetes.settings import KubernetesDiscoverySettings
from pools.launch_spec import (
    LaunchSettings,
    PoolMembers,
    SimLaunchSpec,
    VllmLaunchSpec,
    replica_ids,
)
from pools.metrics_scrape import MetricsSettings
from pools.yaml_errors import (
    ConfigFileError,
    ConfigIssue,
    read_yaml,
    validate_config,
)
from pools.yaml_errors import dotted as _dotted
from router.late_binding import LateBindingParams
from router.pd_decision import PdDecisionParams
from router.policies.config import RouterPolicyConfig
from router.tokenization import TokenizationConfig

FleetConfigIssue = ConfigIssue
"""One problem in a fleet file: field path (`pools.decode.endpoints[1].url`), line, why."""


class FleetConfigError(ConfigFileError):
    """The fleet file is invalid; `issues` lists every problem, the message one per line."""

    default_source = "fleet config"


class FleetConfig(BaseModel):
    """A whole fleet file (see the module docstring).

    One model: `served_model_name`, `pools`, ... at the top level. Several: a `models:` list
    of `ModelConfig` (then none of `MODEL_KEYS` at the top level); the top-level fields then
    read as the first model's (so code that knows one model sees the first), and
    `model_configs()` gives every model as a one-model `FleetConfig` sharing the other
    sections (coordinator, health, metrics, launch).
    """

    model_config = ConfigDict(extra="forbid")

    served_model_name: str = Field(
        default="",
        description="The model name clients send; engines are started with it (required "
        "unless `models:` lists the models).",
    )
    block_size: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="Tokens per KV block (router keys and engines agree).",
    )
    pools: PoolsConfig = Field(default_factory=PoolsConfig)
    pd: PdDecisionParams = Field(default_factory=PdDecisionParams)
    late_binding: LateBindingParams = Field(
        default_factory=LateBindingParams,
        description="Hold requests at the coordinator while every prefilling replica is busy "
        "(router/late_binding.py; off by default).",
    )
    tokenizer: FleetTokenizerConfig = Field(default_factory=FleetTokenizerConfig)
    slo_policy: str | None = Field(
        default=None,
        description="SLO policy YAML of the fleet's pools, relative to the file "
        "(`pdorch serve --slo-policy` wins).",
    )
    models: list[ModelConfig] | None = Field(
        default=None,
        min_length=1,
        description="Several models behind one endpoint, routed by the request's `model`.",
    )
    coordinator: CoordinatorSettings = Field(default_factory=CoordinatorSettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    launch: LaunchSettings = Field(default_factory=LaunchSettings)
    sync: SyncSettings | None = Field(
        default=None, description="Several coordinators: token-load sharing (pdorch/SYNC.md)."
    )
    discovery: KubernetesDiscoverySettings | None = Field(
        default=None,
        description="Replicas found at run time: pods watched by label selector per pool "
        "(pools/kubernetes/README.md).",
    )

    @model_validator(mode="before")
    @classmethod
    def _resolve_relative_paths(cls, data: Any, info: ValidationInfo) -> Any:
        base = (info.context or {}).get("base_dir")
        if base is None or not isinstance(data, dict):
            return data
        data = resolve_model_paths(data, Path(base))
        models = data.get("models")
        if isinstance(models, list):
            data["models"] = [resolve_model_paths(m, Path(base)) for m in models]
        return data

    @model_validator(mode="before")
    @classmethod
    def _one_model_or_models(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        if data.get("models") is not None:
            for key in MODEL_KEYS:
                if key in data:
                    raise FleetFieldError(
                        (key,),
                        "with models: every model gives its own (under models[i]), not the "
                        "top level",
                    )
            return data
        for key in ("served_model_name", "pools"):
            if key not in data:
                raise FleetFieldError((key,), "Field required (or list the models in models:)")
        return data

    @model_validator(mode="after")
    def _check_fleet(self) -> FleetConfig:
        if self.models is None:
            if not self.served_model_name:
                raise FleetFieldError(("served_model_name",), "must not be empty")
            check_model(self, ())
            return self
        for key in ("sync", "discovery"):
            if getattr(self, key) is not None:
                raise FleetFieldError((key,), "not supported with models: yet (one model only)")
        names: set[str] = set()
        for i, model in enumerate(self.models):
            if model.served_model_name in names:
                raise FleetFieldError(
                    ("models", i, "served_model_name"),
                    f"model {model.served_model_name!r} is listed twice",
                )
            names.add(model.served_model_name)
            check_model(self._with_model(model), ("models", i))
        first = self.models[0]  # the top level reads as the first model (class docstring)
        for key in MODEL_KEYS:
            setattr(self, key, getattr(first, key))
        return self

    def _with_model(self, model: ModelConfig) -> FleetConfig:
        fields = {key: getattr(model, key) for key in MODEL_KEYS}
        return self.model_copy(update={**fields, "models": None})

    def model_configs(self) -> list[FleetConfig]:
        """Every model as a one-model fleet config (`[self]` for a one-model file)."""
        if self.models is None:
            return [self]
        return [self._with_model(model) for model in self.models]

    def model_names(self) -> list[str]:
        """The served model names, in file order."""
        return [c.served_model_name for c in self.model_configs()]

    # ---- views the coordinator uses ----------------------------------------------------------

    def router_policy_config(self) -> RouterPolicyConfig:
        """Prefill and decode policies plus the P/D parameters, as `router` takes them."""
        return RouterPolicyConfig(
            prefill=self.pools.policy("prefill"),
            decode=self.pools.policy("decode"),
            pd=self.pd,
            late_binding=self.late_binding,
        )

    def tokenization_config(self, default_engine_url: str | None = None) -> TokenizationConfig:
        return self.tokenizer.tokenization_config(default_engine_url)

    def pool_members(self) -> dict[str, PoolMembers]:
        """Pool name → members, for `pools.launch.launch_fleet`."""
        return dict(self.pools.items())

    def with_sim_time_scale(self, time_scale: float) -> FleetConfig:
        """A copy whose simulated engines all run at `time_scale` (tests run fleets fast)."""
        data = self.model_dump(mode="python")
        if data["models"] is not None:
            for key in MODEL_KEYS:  # they mirror the first model (class docstring)
                data.pop(key)
        for model in data["models"] or [data]:
            for pool in model["pools"].values():
                if pool is None:
                    continue
                for spec in pool["launch"]:
                    if spec["kind"] == "sim":
                        spec["time_scale"] = time_scale
        return FleetConfig.model_validate(data)

    def with_sync_overrides(
        self, bind: str | None = None, peers: Sequence[str] = (), source: str = "command line"
    ) -> FleetConfig:
        """A copy with `pdorch serve --sync-bind/--sync-peer` applied, so one fleet file can
        serve every coordinator: `bind` replaces `sync.bind`; `peers` are appended to
        `sync.peers` (duplicates dropped, order kept; the own `bind` is skipped at connect
        time). A file without `sync:` gets one, its other settings at their defaults. Nothing
        given: `self`. A bad endpoint raises FleetConfigError naming `sync.bind`/`sync.peers`."""
        if bind is None and not peers:
            return self
        data: dict[str, Any] = self.sync.model_dump() if self.sync is not None else {}
        if bind is not None:
            data["bind"] = bind
        data["peers"] = list(dict.fromkeys([*data.get("peers", []), *peers]))
        try:
            sync = SyncSettings.model_validate(data)
        except ValidationError as err:
            issues = [
                FleetConfigIssue(
                    _dotted(("sync", *e["loc"])), str(e["msg"]).removeprefix("Value error, ")
                )
                for e in err.errors()
            ]
            raise FleetConfigError(issues, source) from None
        return self.model_copy(update={"sync": sync})


def demo_fleet_config(time_scale: float = 1.0) -> FleetConfig:
    """The embedded demo (`pdorch serve` without `--config`), identical to
    `deploy/examples/fleet-sim.yaml`: 2 prefill + 2 decode simulated engines, Llama-3.1-8B on
    one H100 each, in process, real time unless `time_scale` says otherwise."""
    sim = {
        "kind": "sim",
        "count": 2,
        "model_profile": "llama-3.1-8b",
        "gpu": "h100",
        "tp": 1,
        "time_scale": time_scale,
        "kv_transport": "tcp",
    }
    return FleetConfig.model_validate(
        {
            "served_model_name": "llama-3.1-8b",
            "block_size": 16,
            "pools": {
                "prefill": {"policy": {"name": "token_load"}, "launch": [sim]},
                "decode": {
                    "policy": {
                        "name": "token_load_decode",
                        "params": {"expected_output_tokens": 256},
                    },
                    "launch": [sim],
                },
            },
            "pd": {"min_uncached_tokens": 512, "max_prefill_queue_s": 1.0},
            "tokenizer": {"mode": "engine"},
            "coordinator": {"host": "127.0.0.1", "port": 8000},
        }
    )


# ---- loading and error formatting ------------------------------------------------------------


def parse_fleet_config(
    data: Any,
    *,
    base_dir: Path | None = None,
    source: str | None = None,
    lines: Mapping[tuple[str | int, ...], int] | None = None,
) -> FleetConfig:
    """Validate a mapping; FleetConfigError names every bad field (and line, given `lines`)."""
    return validate_config(
        FleetConfig, data, FleetConfigError, base_dir=base_dir, source=source, lines=lines
    )


def load_fleet_config(path: str | Path) -> FleetConfig:
    """Read and validate a fleet YAML file; relative paths in it are relative to its directory.

    Raises FleetConfigError (`file:line: field.path: why`), also for YAML syntax errors, and
    FileNotFoundError for a missing file.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    data, lines = read_yaml(text, FleetConfigError, str(path))
    return parse_fleet_config(data, base_dir=path.parent.resolve(), source=str(path), lines=lines)


__all__ = [
    "POOL_NAMES",
    "AdmissionSettings",
    "CoordinatorSettings",
    "FleetConfig",
    "FleetConfigError",
    "FleetConfigIssue",
    "FleetTokenizerConfig",
    "HealthSettings",
    "LaunchSettings",
    "MetricsSettings",
    "ModelConfig",
    "PoolConfig",
    "PoolsConfig",
    "SimLaunchSpec",
    "VllmLaunchSpec",
    "demo_fleet_config",
    "load_fleet_config",
    "parse_fleet_config",
    "replica_ids",
]
