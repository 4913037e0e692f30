"""A replica's hardware profile in a fleet file, and the routing constants it implies.

`hardware: {gpu: h200, model_profile: llama-3.1-8b, tp: 1}` on a static endpoint, or on a
pool (then for each of its members without their own), tells the router what the replica's
timing profile is (`pools/sim/profiles.py`, the same numbers the simulated engine runs on):

    prefill_tokens_per_s   = B / prefill_time(B)        B = max_num_batched_tokens (8192):
                                                       full chunks, the weight read inside
    decode_s_per_kv_token  = kv_per_token_per_rank / (hbm_bytes_per_s · hbm_efficiency)

Both reach the routing snapshots (`ReplicaStatic`; the coordinator's `pdorch/app/state.py`):
`token_load`, the P/D decision and late binding read `prefill_tokens_per_s` (today they assume
`default_prefill_tokens_per_s` on live replicas without it), `token_load@per_replica_decode_cost`
and `latency_predictor` read `decode_s_per_kv_token` (issue 15: an H200 replica priced as an
H200, not with the H100 default). Without `hardware` nothing changes. A bad name is an error
naming the field (`pools.prefill.hardware.gpu: unknown gpu profile 'h900'; known: ...`).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


def _known_model_profile(value: str) -> str:
    from pools.sim.profiles import MODELS  # lazy: the fleet-file loader stays light

    if value not in MODELS:
        raise ValueError(f"unknown model profile {value!r}; known: {', '.join(MODELS)}")
    return value


def _known_gpu_profile(value: str) -> str:
    from pools.sim.profiles import GPUS

    if value not in GPUS:
        raise ValueError(f"unknown gpu profile {value!r}; known: {', '.join(GPUS)}")
    return value


# A profile name checked against the simulator's tables (`pools/sim/profiles.py`); shared by
# every schema that names one (here and the simulated engine's launch spec).
ModelProfileName = Annotated[str, AfterValidator(_known_model_profile)]
GpuProfileName = Annotated[str, AfterValidator(_known_gpu_profile)]


class HardwareSpec(BaseModel):
    """The timing profile a replica runs on (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: GpuProfileName = Field(
        description="GPU profile (pools.sim.profiles.GPUS), e.g. h100, h200."
    )
    model_profile: ModelProfileName = Field(
        default="llama-3.1-8b", description="Model profile (pools.sim.profiles.MODELS)."
    )
    tp: int = Field(default=1, ge=1, description="Tensor-parallel GPUs per replica.")
    max_num_batched_tokens: int = Field(
        default=8192, ge=1, description="The engine's token budget per step (vLLM's default)."
    )

    def costs(self) -> tuple[float, float]:
        """(prefill tokens/s, decode seconds per KV token) of this profile."""
        from pools.sim.timing import make_timing

        budget = self.max_num_batched_tokens
        timing = make_timing(
            self.model_profile, self.gpu, tp=self.tp, max_num_batched_tokens=budget
        )
        return budget / timing.prefill_time(budget), timing.decode_s_per_kv_token
