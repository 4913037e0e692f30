"""min and p10 of the pick stage at 8k x 1024, policy per argv[1] (load-robust: low quantiles)."""
import sys, time
from benchmarks.router_bench import setup_decisions
from benchmarks.fleet_sim.policies import router_config_for
from router.policies.config import build_policy
from router.replica_state import RoutingRequest
spec = sys.argv[1]
s = setup_decisions(8192, 1024, 400)
policy = build_policy(router_config_for(spec).prefill)
ts = []
for i, tok in enumerate(s.prompts):
    keys = s.index.keys_for(tok); ov = s.index.overlap(keys)
    req = RoutingRequest(request_id=f"b{i}", prompt_tokens=len(tok), block_size=16, block_keys=keys)
    cols = s.columns.build(s.replica_ids, ov, s.load, s.now)
    t = time.perf_counter_ns(); policy.pick(req, cols, s.now); ts.append((time.perf_counter_ns() - t) / 1000)
ts.sort()
print(spec, "min %.0f p10 %.0f p50 %.0f" % (ts[0], ts[len(ts)//10], ts[len(ts)//2]))
