#!/bin/bash
# proxy-8's timed runs, each its own quiet-lane job (/tmp/s9/inquiet.sh), in this order:
# whole answers, 256-token streams,
# then the A/B: main vs the branch, each exported with
# `git archive <commit> | tar -x -C DIR` and run from its own tree by PYTHONPATH, alternated.
B=/work/main/.venv/bin
T=/tmp/proxy8
R=/work/wt/proxy/benchmarks/results
q() {  # name, dir, command...
  local name=$1 dir=$2; shift 2
  cd "$dir" && PYTHONPATH=$dir /tmp/s9/inquiet.sh bash -c "echo $name-start \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) >> $T/quiet_times.txt; $* > $T/$name.out 2> $T/$name.err; echo $name-end \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) >> $T/quiet_times.txt"
}
q whole $T/branch $B/pdorch bench proxy --requests 1000 --concurrency 1,32 --rounds 4 --targets direct,vllm-router,pdorch-aiohttp,pdorch-native --json --out $R/proxy-8-whole.json
q stream $T/branch $B/pdorch bench proxy --stream --max-tokens 256 --requests 1024 --warmup 16 --concurrency 1,32,256 --rounds 2 --targets direct,vllm-router,pdorch-aiohttp,pdorch-native --json --out $R/proxy-8-stream.json
for i in 1 2 3; do
  for side in base branch; do
    q ab-$side-$i $T/$side $B/pdorch bench proxy --requests 1000 --concurrency 1,32 --rounds 2 --targets vllm-router,pdorch-native --json --out $R/proxy-8-ab/ab-$side-$i.json
  done
done
echo done >> $T/quiet_times.txt
