"""The fleet file's `hardware:` (pools/hardware.py): per-replica routing constants from the
replica's timing profile, on static endpoints and launched engines, reaching the router."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdorch.config.fleet import FleetConfigError, load_fleet_config, parse_fleet_config
from pools.hardware import HardwareSpec
from pools.launch import plan_fleet
from pools.launch_engines import EngineBase
from pools.replica import ReplicaEndpoint
from pools.sim.timing import make_timing

FLEET = {
    "served_model_name": "m",
    "pools": {
        "prefill": {
            "hardware": {"gpu": "h100"},
            "endpoints": [
                {"url": "http://p:1"},
                {"url": "http://p:2", "hardware": {"gpu": "h200"}},
            ],
        },
        "decode": {
            "hardware": {"gpu": "h200", "model_profile": "llama-3.1-8b"},
            "launch": [{"kind": "sim", "count": 1, "model_profile": "tiny"}],
        },
        "colocated": {"endpoints": [{"url": "http://c:1"}]},
    },
}


def test_profile_constants_match_the_timing_model() -> None:
    tps, c = HardwareSpec(gpu="h200").costs()
    timing = make_timing("llama-3.1-8b", "h200")
    assert tps == 8192 / timing.prefill_time(8192)
    assert c == timing.decode_s_per_kv_token
    h100_tps, h100_c = HardwareSpec(gpu="h100").costs()
    # H200: the same FLOP/s, 1.4x the HBM bandwidth; the H100's is token_load's 4e-8 default
    assert c < h100_c and h100_c == pytest.approx(4e-8, rel=0.1)
    assert tps == pytest.approx(h100_tps, rel=0.05)


def test_endpoints_and_engines_carry_their_pools_or_own_profile(tmp_path: Path) -> None:
    config = parse_fleet_config(FLEET)
    plan, order = plan_fleet(config, tmp_path, tmp_path)
    h100, h200 = HardwareSpec(gpu="h100").costs(), HardwareSpec(gpu="h200").costs()
    by_id = {}
    for item in plan:
        if isinstance(item, ReplicaEndpoint):
            by_id[item.replica_id] = (item.prefill_tokens_per_s, item.decode_s_per_kv_token)
        else:
            assert isinstance(item, EngineBase)
            ep = item.served_endpoint("http://127.0.0.1:9", 100, "sim", False)
            by_id[item.replica_id] = (ep.prefill_tokens_per_s, ep.decode_s_per_kv_token)
    assert by_id == {
        "prefill-0": h100,
        "prefill-1": h200,  # its own wins over the pool's
        "decode-0": h200,
        "colocated-0": (None, None),  # no profile: the router's defaults
    }
    assert order == ["prefill-0", "prefill-1", "decode-0", "colocated-0"]


def test_a_bad_profile_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "served_model_name: m\n"
        "pools:\n"
        "  prefill:\n"
        "    hardware: {gpu: h900}\n"
        "    endpoints: [{url: 'http://p:1'}]\n"
        "  decode:\n"
        "    endpoints: [{url: 'http://d:1', hardware: {gpu: h200, tp: 0}}]\n"
    )
    with pytest.raises(FleetConfigError) as info:
        load_fleet_config(path)
    text = str(info.value)
    assert "pools.prefill.hardware.gpu" in text and "unknown gpu profile 'h900'" in text
    assert "pools.decode.endpoints[0].hardware.tp" in text


def test_the_coordinators_statics_carry_the_constants() -> None:
    from pdorch.app.fleet_follow import static_of
    from pools.replica import Replica

    tps, c = HardwareSpec(gpu="h200").costs()
    ep = ReplicaEndpoint("p0", "prefill", "http://p:1", "m", 16, prefill_tokens_per_s=tps,
                         decode_s_per_kv_token=c)  # fmt: skip
    static = static_of(Replica(ep))
    assert (static.healthy, static.prefill_tokens_per_s, static.decode_s_per_kv_token) == (
        True,
        tps,
        c,
    )
    assert not static_of(Replica(ep, healthy=False)).healthy
    bare = static_of(Replica(ReplicaEndpoint("p1", "prefill", "http://p:2", "m", 16)))
    assert bare.prefill_tokens_per_s is None and bare.decode_s_per_kv_token is None
