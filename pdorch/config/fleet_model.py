"""The schema of one model in a fleet file: its pools (members + routing policy), tokenizer,
P/D parameters and SLO policy (`ModelConfig`, one entry of `models:`; a one-model file has
the same fields at its top level, `pdorch/config/fleet.py`), and the resolution of the
relative paths in them (launch specs' model/tokenizer, tokenizer `model_dir`, `slo_policy`)
against the file's directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pools.launch_spec import PoolMembers
from router.pd_decision import PdDecisionParams
from router.policies.config import PolicyConfig
from router.tokenization import TokenizationConfig, TokenizerMode

POOL_NAMES = ("prefill", "decode", "colocated")
DEFAULT_POLICIES = {
    "prefill": "token_load",
    "decode": "token_load_decode",
    "colocated": "token_load",
}


class PoolConfig(PoolMembers):
    """One pool: its members (`endpoints`, `launch`) and the policy that picks among them."""

    policy: PolicyConfig | None = Field(
        default=None,
        description="Routing policy for this pool (router/README.md); default per pool: "
        "prefill token_load, decode token_load_decode, colocated token_load.",
    )


class PoolsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prefill: PoolConfig = Field(default_factory=PoolConfig)
    decode: PoolConfig = Field(default_factory=PoolConfig)
    colocated: PoolConfig | None = None

    def items(self) -> list[tuple[str, PoolConfig]]:
        """(pool name, config) of every configured pool, in prefill, decode, colocated order."""
        pools = [("prefill", self.prefill), ("decode", self.decode)]
        if self.colocated is not None:
            pools.append(("colocated", self.colocated))
        return pools

    def policy(self, pool: str) -> PolicyConfig:
        """The pool's policy, or its default."""
        config = dict(self.items()).get(pool)
        if config is not None and config.policy is not None:
            return config.policy
        return PolicyConfig(name=DEFAULT_POLICIES[pool])


class FleetTokenizerConfig(TokenizationConfig):
    """`router.tokenization.TokenizationConfig`, default mode `engine`; in that mode
    `engine_url` may be left out: the coordinator then asks one of the fleet's replicas."""

    mode: TokenizerMode = Field(default=TokenizerMode.ENGINE, description="hf | engine | chars")

    @model_validator(mode="after")
    def _check_mode(self) -> FleetTokenizerConfig:
        if self.mode is TokenizerMode.HF and self.model_dir is None:
            raise ValueError("model_dir: required when mode is 'hf'")
        return self

    def tokenization_config(self, default_engine_url: str | None = None) -> TokenizationConfig:
        """The router's config, with `default_engine_url` filled in where none is set."""
        data = self.model_dump()
        if self.mode is TokenizerMode.ENGINE and self.engine_url is None:
            data["engine_url"] = default_engine_url
        if self.mode is TokenizerMode.ENGINE and data["model"] is None:
            data.pop("model")
        return TokenizationConfig.model_validate(data)


MODEL_KEYS = ("served_model_name", "block_size", "pools", "pd", "tokenizer", "slo_policy")
"""The fields that describe one model: top level in a one-model file, per entry of `models:`."""


class ModelConfig(BaseModel):
    """One model of a several-model fleet (`models:`): its own pools, tokenizer, routing
    profiles (the pools' `policy`), P/D parameters and optional SLO policy."""

    model_config = ConfigDict(extra="forbid")

    served_model_name: str = Field(
        min_length=1, description="The model name clients send; engines are started with it."
    )
    block_size: int = Field(
        default=16, ge=1, le=4096, description="Tokens per KV block of this model's engines."
    )
    pools: PoolsConfig
    pd: PdDecisionParams = Field(default_factory=PdDecisionParams)
    tokenizer: FleetTokenizerConfig = Field(default_factory=FleetTokenizerConfig)
    slo_policy: str | None = Field(
        default=None,
        description="SLO policy YAML of this model's pools (autoscale/README.md); relative to "
        "the fleet file. Bounds its pools' scaling (pool limits); see FLEET_API.md.",
    )


def resolve_model_paths(data: Any, base: Path) -> Any:
    """Relative paths of one model's fields (tokenizer, launch specs, SLO policy) → absolute."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    tokenizer = data.get("tokenizer")
    if isinstance(tokenizer, dict) and isinstance(tokenizer.get("model_dir"), str):
        path = Path(tokenizer["model_dir"])
        if not path.is_absolute():
            data["tokenizer"] = {**tokenizer, "model_dir": str((base / path).resolve())}
    pools = data.get("pools")
    if isinstance(pools, dict):
        data["pools"] = {name: _resolve_pool_paths(pool, base) for name, pool in pools.items()}
    slo = data.get("slo_policy")
    if isinstance(slo, str) and not Path(slo).is_absolute():
        data["slo_policy"] = str((base / slo).resolve())
    return data


def _resolve_pool_paths(pool: Any, base: Path) -> Any:
    if not isinstance(pool, dict) or not isinstance(pool.get("launch"), list):
        return pool
    launch = []
    for spec in pool["launch"]:
        if isinstance(spec, dict):
            key = {"vllm": "model", "sim": "tokenizer"}.get(str(spec.get("kind")))
            value = spec.get(key) if key else None
            if key and isinstance(value, str) and not Path(value).is_absolute():
                if value.startswith("builtin:"):  # a tokenizer shipped with pdorch, not a path
                    launch.append(spec)
                    continue
                spec = {**spec, key: str((base / value).resolve())}
        launch.append(spec)
    return {**pool, "launch": launch}
