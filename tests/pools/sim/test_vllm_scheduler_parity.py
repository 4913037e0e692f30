"""The sim engine core against vLLM's own v1 scheduler, step by step (e2e: imports real vLLM).

Both get the same request sequence (shared prefixes, salted prompts, a small block pool so that
chunked prefill, eviction and preemption all happen) and the same sampled tokens (pdorch's
`TokenGenerator` feeds vLLM's scheduler through a `ModelRunnerOutput`, so no model runs).
After every step the scheduled token count and the KV events (hashes, parents, token ids,
extra keys, order) must be identical, and at the end the prefix-cache counters.
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import pytest

from pools.sim.config import EngineConfig
from pools.sim.engine_core import EngineCore
from pools.sim.request import SimRequest
from pools.sim.timing import make_timing
from pools.sim.token_gen import TokenGenerator

pytestmark = pytest.mark.e2e

BS = 32


def _norm(events: list[Any]) -> list[dict[str, Any]]:
    keep = ("block_hashes", "parent_block_hash", "token_ids", "extra_keys")
    out = []
    for e in events:
        d: dict[str, Any] = {"type": type(e).__name__}
        for f in keep:
            if hasattr(e, f):
                v = getattr(e, f)
                if f == "extra_keys" and v is not None:
                    v = [None if x is None else tuple(x) for x in v]
                d[f] = v
        out.append(d)
    return out


def _workload(seed: int, n: int) -> list[tuple[int, SimRequest]]:
    rng = random.Random(seed)
    shared = [
        [rng.randrange(4096) for _ in range(rng.choice([40, 64, 100, 150]))] for _ in range(4)
    ]
    out = []
    for i in range(n):
        p = list(rng.choice(shared)) + [rng.randrange(4096) for _ in range(rng.randrange(0, 200))]
        salt = "s" if rng.random() < 0.15 else None
        req = SimRequest(f"r{i}", p, max_tokens=rng.randrange(1, 80), cache_salt=salt)
        out.append((rng.randrange(0, 6), req))
    return out


@pytest.mark.parametrize(
    ("num_blocks", "budget", "max_seqs", "n_req", "seed"),
    [(40, 256, 4, 24, 0), (20, 64, 8, 40, 1), (60, 512, 16, 60, 2)],
)
def test_step_by_step_parity_with_vllm_scheduler(
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    num_blocks: int,
    budget: int,
    max_seqs: int,
    n_req: int,
    seed: int,
) -> None:
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    import torch
    from vllm.config import KVEventsConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from tests.pools.sim.fake_vllm_publisher import FakeKvEventPublisher

    args = EngineArgs(
        model=str(tiny_model_dir),
        block_size=BS,
        enable_prefix_caching=True,
        prefix_caching_hash_algo="sha256_cbor",
        max_model_len=2048,
        max_num_batched_tokens=budget,
        max_num_seqs=max_seqs,
        enforce_eager=True,
    )
    vc = args.create_engine_config()
    vc.cache_config.num_gpu_blocks = num_blocks
    vc.kv_events_config = KVEventsConfig(
        enable_kv_cache_events=True,
        publisher="zmq",
        endpoint=f"inproc://pdorch-parity-{uuid.uuid4().hex}",  # unique: shared zmq context
        replay_endpoint=None,
    )
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=4, head_size=64, dtype=torch.bfloat16)
    kvc = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)],
    )
    sched = Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BS, log_stats=True)
    sched.kv_event_publisher.shutdown()
    publisher = FakeKvEventPublisher()
    sched.kv_event_publisher = publisher
    init_none_hash(sha256_cbor)
    hasher = get_request_block_hasher(BS, sha256_cbor)

    core = EngineCore(
        EngineConfig(
            block_size=BS,
            num_gpu_blocks=num_blocks,
            max_num_batched_tokens=budget,
            max_num_seqs=max_seqs,
            max_model_len=2048,
            vocab_size=4096,
            kv_connector=False,
        ),
        make_timing("tiny", "cpu"),
    )
    gen = TokenGenerator(4096)
    arrivals: dict[int, list[SimRequest]] = {}
    for step_no, req in _workload(seed, n_req):
        arrivals.setdefault(step_no, []).append(req)
    seeds: dict[str, int | None] = {}
    vq = vh = vpq = vph = 0
    n_events = 0
    step = 0
    while arrivals or core.has_unfinished() or sched.has_unfinished_requests():
        for req in arrivals.pop(step, []):
            core.add_request(req, float(step))
            seeds[req.request_id] = req.seed
            params = SamplingParams(max_tokens=req.max_tokens, ignore_eos=True)
            sched.add_request(
                Request(
                    req.request_id,
                    list(req.prompt_token_ids),
                    params,
                    None,
                    arrival_time=float(step),
                    cache_salt=req.cache_salt,
                    block_hasher=hasher,
                )
            )
        res = core.step(float(step))
        so = sched.schedule()
        assert res.num_scheduled_tokens == so.total_num_scheduled_tokens, f"step {step}"
        req_ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in req_ids:
            vr = sched.requests[rid]
            done = vr.num_computed_tokens >= vr.num_tokens
            sampled.append([gen.after(vr.all_token_ids, seeds[rid])] if done else [])
        index = {r: i for i, r in enumerate(req_ids)}
        outs = sched.update_from_output(
            so, ModelRunnerOutput(req_ids=req_ids, req_id_to_index=index, sampled_token_ids=sampled)
        )
        for eco in outs.values():
            vst = eco.scheduler_stats
            if vst is not None:
                pcs = vst.prefix_cache_stats
                vq, vh = vq + pcs.queries, vh + pcs.hits
                vpq, vph = vpq + pcs.preempted_queries, vph + pcs.preempted_hits
        ours = _norm(core.drain_events())
        assert ours == _norm(publisher.events), f"KV events differ at step {step}"
        publisher.events = []
        n_events += len(ours)
        step += 1
        assert step < 5000
    st = core.stats()
    assert n_events > 0 and st.num_preemptions > 0
    assert (st.prefix_cache_queries, st.prefix_cache_hits) == (vq, vh)
    assert (st.preempted_prefix_cache_queries, st.preempted_prefix_cache_hits) == (vpq, vph)
