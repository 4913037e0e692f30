"""The fleet file's cross-field rules: what no single field's validator can see.

Checked by `FleetConfig` (`pdorch/config/fleet.py`) after its fields validate, once per model,
so a bad file fails at load time, before any engine starts: every pool's policy builds (names,
params, weights as the router takes them), every vLLM launch spec builds its engine spec (block
size on CPU, block count vs max_model_len), at least one pool can serve requests (or is
discovered), a discovered colocated pool is configured, and replica ids are unique. Each rule
raises `FleetFieldError` with the field path it is about (`models[1].pools.decode.policy...`),
which the loader turns into `file:line: field.path: why`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import ValidationError

from pools.launch_spec import VllmLaunchSpec, replica_ids
from pools.roles import EngineRole
from pools.yaml_errors import FieldPathError, dotted
from router.policies.config import PolicyConfigError, build_policy

if TYPE_CHECKING:
    from pdorch.config.fleet import FleetConfig


class FleetFieldError(FieldPathError):
    """A cross-field rule failed at `path` (kept so the error can name the field and line)."""


def check_model(fleet: FleetConfig, prefix: tuple[str | int, ...]) -> None:
    """One model's cross-field rules (policies, vLLM specs, a pool that serves, unique ids);
    `prefix` is where the model sits in the file (`models[i]`, or the top level)."""
    for name, pool in fleet.pools.items():
        if pool.policy is not None:
            try:
                build_policy(pool.policy)
            except PolicyConfigError as err:
                # the router names the field inside the policy: "params.x: why"
                where, _, why = str(err).partition(": ")
                sub = tuple(where.split(".")) if why else ()
                raise FleetFieldError(
                    (*prefix, "pools", name, "policy", *sub), why or str(err)
                ) from None
        for i, spec in enumerate(pool.launch):
            if isinstance(spec, VllmLaunchSpec):
                check_vllm_spec(spec, (*prefix, "pools", name, "launch", i), fleet)
    serving = fleet.pools.decode.size() + (
        fleet.pools.colocated.size() if fleet.pools.colocated is not None else 0
    )
    found = set(fleet.discovery.pools) if fleet.discovery is not None else set()
    if serving == 0 and not found & {"decode", "colocated"}:
        raise FleetFieldError(
            (*prefix, "pools", "decode"),
            "no replica can serve requests: give pools.decode (or pools.colocated) at "
            "least one endpoint or launch spec, or discover it (discovery.pools.decode)",
        )
    if "colocated" in found and fleet.pools.colocated is None:
        raise FleetFieldError(
            ("discovery", "pools", "colocated"),
            "pool colocated is discovered but not configured: add pools.colocated: {}",
        )
    seen: dict[str, tuple[str | int, ...]] = {}
    for name, pool in fleet.pools.items():
        for i, (replica_id, _) in enumerate(replica_ids(name, pool)):
            path: tuple[str | int, ...] = (*prefix, "pools", name, "endpoints", i)
            if replica_id in seen:
                raise FleetFieldError(
                    (*path, "id") if i < len(pool.endpoints) else (*prefix, "pools", name),
                    f"replica id {replica_id!r} is used twice",
                )
            seen[replica_id] = path


def check_vllm_spec(spec: VllmLaunchSpec, path: tuple[str | int, ...], fleet: FleetConfig) -> None:
    """Build the engine spec with placeholder ports so A's rules (block size on CPU, block
    count vs max_model_len, ...) fail at load time, naming the launch spec's field."""
    try:
        spec.engine_spec(
            role=EngineRole.BOTH,
            port=1,
            side_channel_port=2,
            served_model_name=fleet.served_model_name,
            block_size=fleet.block_size,
        )
    except ValidationError as err:
        first = err.errors()[0]
        loc = tuple(first["loc"])
        msg = str(first["msg"]).removeprefix("Value error, ")
        if "block_size" in msg and not loc:
            raise FleetFieldError(("block_size",), f"{msg} (needed by {dotted(path)})") from None
        raise FleetFieldError((*path, *loc), msg) from None
