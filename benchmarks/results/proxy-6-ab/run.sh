#!/bin/bash
# proxy-6's timed runs, in this order, each its own quiet-lane job (/tmp/s9/inquiet.sh):
# whole answers, 256-token streams, the after-profile, then the A/B: main (f5b2550) vs the
# branch (34ac725), each exported with `git archive <commit> | tar -x -C DIR` and run from its
# own tree by PYTHONPATH, alternated base, branch, base, branch, ...; vllm-router in every run.
B=/work/main/.venv/bin
T=/tmp/proxy6
R=/work/wt/proxy/benchmarks/results
q() {  # name, dir, command...
  local name=$1 dir=$2; shift 2
  cd "$dir" && PYTHONPATH=$dir /tmp/s9/inquiet.sh bash -c "echo $name-start \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) >> $T/quiet_times.txt; $* > /dev/null 2> $T/$name.err; echo $name-end \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) >> $T/quiet_times.txt"
}
q whole $T/branch $B/pdorch bench proxy --requests 1000 --concurrency 1,32 --rounds 4 --targets direct,vllm-router,pdorch-aiohttp,pdorch-native --json --out $R/proxy-6-whole.json
q stream $T/branch $B/pdorch bench proxy --stream --max-tokens 256 --requests 1024 --warmup 16 --concurrency 1,32,256 --rounds 2 --targets direct,vllm-router,pdorch-aiohttp,pdorch-native --json --out $R/proxy-6-stream.json
q profile $T/branch $B/pdorch bench proxy --requests 3000 --concurrency 1,32 --targets vllm-router,pdorch-native --py-spy-dir $T/prof-after --json --out $R/proxy-6-profile-after.json
for i in 1 2 3; do
  for side in base branch; do
    q ab-$side-$i $T/$side $B/pdorch bench proxy --requests 1000 --concurrency 1,32 --rounds 2 --targets vllm-router,pdorch-native --json --out $R/proxy-6-ab/ab-$side-$i.json
  done
done
echo done >> $T/quiet_times.txt
