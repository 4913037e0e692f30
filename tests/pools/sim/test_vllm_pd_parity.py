"""P/D against vLLM's own scheduler with its NixlConnector (scheduler side, in-process; e2e).

The prefill leg's `kv_transfer_params`, the decode leg's wait for remote KV (with a partial local
prefix hit), the single recomputed token after the load, the prefix-cache and connector
counters, the prompt-token sources and the KV events must match vLLM exactly.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from pools.ports import free_port
from pools.sim.config import EngineConfig
from pools.sim.engine_core import EngineCore, RequestOutput
from pools.sim.request import SimRequest
from pools.sim.timing import make_timing
from pools.sim.token_gen import TokenGenerator
from transfer.params import KvTransferParams

pytestmark = pytest.mark.e2e

BS = 32
NB = 60


def _stored(events: list[Any]) -> list[tuple[list[int], int | None]]:
    return [
        (list(e.block_hashes), e.parent_block_hash)
        for e in events
        if type(e).__name__ == "BlockStored"
    ]


def test_pd_flow_matches_vllm_nixl_connector(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    import torch
    from vllm.config import KVEventsConfig, KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from tests.pools.sim.fake_vllm_publisher import FakeKvEventPublisher

    def vllm_sched() -> tuple[Any, FakeKvEventPublisher]:
        args = EngineArgs(
            model=str(tiny_model_dir),
            block_size=BS,
            enable_prefix_caching=True,
            prefix_caching_hash_algo="sha256_cbor",
            max_model_len=2048,
            max_num_batched_tokens=256,
            max_num_seqs=8,
            enforce_eager=True,
            kv_transfer_config=KVTransferConfig(
                kv_connector="NixlConnector", kv_role="kv_both", kv_buffer_device="cpu"
            ),
        )
        vc = args.create_engine_config()
        vc.cache_config.num_gpu_blocks = NB
        vc.kv_events_config = KVEventsConfig(
            enable_kv_cache_events=True,
            publisher="zmq",
            endpoint=f"inproc://pdorch-pd-parity-{uuid.uuid4().hex}",  # unique: shared zmq context
            replay_endpoint=None,
        )
        spec = FullAttentionSpec(block_size=BS, num_kv_heads=4, head_size=64, dtype=torch.bfloat16)
        kvc = KVCacheConfig(
            num_blocks=NB,
            kv_cache_tensors=[],
            kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn.attn"], spec)],
        )
        s = Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BS, log_stats=True)
        s.kv_event_publisher.shutdown()
        pub = FakeKvEventPublisher()
        s.kv_event_publisher = pub
        return s, pub

    def sim_core(engine_id: str) -> EngineCore:
        cfg = EngineConfig(
            block_size=BS,
            num_gpu_blocks=NB,
            max_num_batched_tokens=256,
            max_num_seqs=8,
            max_model_len=2048,
            vocab_size=4096,
            engine_id=engine_id,
        )
        return EngineCore(cfg, make_timing("tiny", "cpu"))

    init_none_hash(sha256_cbor)
    hasher = get_request_block_hasher(BS, sha256_cbor)
    gen = TokenGenerator(4096)
    stats: dict[int, list[Any]] = {}

    def vstep(s: Any, recv: set[str] | None = None) -> tuple[Any, list[Any]]:
        so = s.schedule()
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            r = s.requests[rid]
            done = r.num_computed_tokens >= r.num_tokens
            sampled.append([gen.after(r.all_token_ids, None)] if done else [])
        mro = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: i for i, r in enumerate(ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(finished_recving=recv) if recv else None,
        )
        outs = []
        for eco in s.update_from_output(so, mro).values():
            outs.extend(eco.outputs)
            if eco.scheduler_stats is not None:
                stats.setdefault(id(s), []).append(eco.scheduler_stats)
        return so, outs

    def vreq(rid: str, prompt: list[int], max_tokens: int, params: Any = None) -> Any:
        r = Request(
            rid, prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True), None,
            arrival_time=0.0, block_hasher=hasher,
        )  # fmt: skip
        r.kv_transfer_params = params
        return r

    prompt = [(i * 37) % 4000 + 20 for i in range(150)]
    p_params_in = KvTransferParams.prefill_request()  # vLLM's Request takes the wire dict

    # prefill leg
    vp, _ = vllm_sched()
    sp = sim_core("P")
    vp.add_request(vreq("x", prompt, 1, p_params_in.wire()))
    sp.add_request(SimRequest("x", prompt, max_tokens=1, kv_transfer_params=p_params_in), 0)
    _, vouts = vstep(vp)
    res = sp.step(0.0)
    (vout,) = vouts
    (sout,) = res.outputs
    v_params = dict(vout.kv_transfer_params)
    assert sout.kv_transfer_params is not None
    s_params = sout.kv_transfer_params.wire()
    assert set(s_params) == set(v_params)
    assert [list(g) for g in v_params["remote_block_ids"]] == s_params["remote_block_ids"]
    for key in ("do_remote_prefill", "do_remote_decode", "tp_size", "dcp_size", "pp_size"):
        assert s_params[key] == v_params[key], key
    for key in ("remote_num_tokens", "transfer_mode", "remote_prefill_cached_tokens"):
        assert s_params[key] == v_params[key], key
    assert vout.new_token_ids == sout.new_token_ids and sout.finish_reason == "length"

    # decode leg, with 64 tokens already cached locally
    vd, vpub = vllm_sched()
    sd = sim_core("D")
    vd.add_request(vreq("warm", prompt[:70], 1))
    sd.add_request(SimRequest("warm", prompt[:70], max_tokens=1), 0)
    vstep(vd)
    sd.step(0.0)
    vpub.events.clear()
    sd.drain_events()
    d_params = KvTransferParams.parse(v_params)  # what the coordinator forwards
    vd.add_request(vreq("x", prompt, 5, d_params.wire()))
    sd.add_request(SimRequest("x", prompt, max_tokens=5, kv_transfer_params=d_params), 0)
    so, _ = vstep(vd)
    res = sd.step(1.0)
    assert so.total_num_scheduled_tokens == res.num_scheduled_tokens == 0
    (load,) = res.new_remote_loads
    v_blocks = vd.kv_cache_manager.get_blocks("x").get_block_ids()[0]
    assert load.local_block_ids == list(v_blocks[load.first_block :])
    assert vd.requests["x"].num_computed_tokens == 150

    # the load completes: vLLM learns it from the worker's output, the sim from the caller
    vstep(vd, recv={"x"})
    sd.finish_remote_load("x", True, 1.0)
    v_outs: list[Any] = []
    s_outs: list[RequestOutput] = []
    scheduled = []
    for _ in range(5):
        so, outs = vstep(vd)
        res = sd.step(2.0)
        scheduled.append((so.total_num_scheduled_tokens, res.num_scheduled_tokens))
        v_outs.extend(outs)
        s_outs.extend(res.outputs)
    assert scheduled[0] == (1, 1)  # only the last prompt token is recomputed
    assert [o.new_token_ids for o in v_outs] == [o.new_token_ids for o in s_outs]
    first = v_outs[0].prefill_stats
    assert first.num_local_cached_tokens == s_outs[0].num_local_cached_tokens == 64
    assert first.num_external_cached_tokens == s_outs[0].num_external_tokens == 86
    assert first.num_computed_tokens == s_outs[0].num_local_compute_tokens == 0
    assert _stored(vpub.events) == _stored(sd.drain_events())

    vq = sum(s.prefix_cache_stats.queries for s in stats[id(vd)])
    vh = sum(s.prefix_cache_stats.hits for s in stats[id(vd)])
    cq = sum(s.connector_prefix_cache_stats.queries for s in stats[id(vd)])
    ch = sum(s.connector_prefix_cache_stats.hits for s in stats[id(vd)])
    st = sd.stats()
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (vq, vh)
    assert (st.external_prefix_cache_queries, st.external_prefix_cache_hits) == (cq, ch)
