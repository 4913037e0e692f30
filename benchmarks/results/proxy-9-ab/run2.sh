#!/bin/bash
# proxy-9's second A/B (the first, run.sh's 1000-request pairs, drowned in the box's load
# 25-28): main vs the branch, whole answers, longer jobs (3000 requests x 2 rounds per target
# and C), four alternated pairs, each a quiet-lane job under 3 min. The trees are run.sh's
# exports (/tmp/proxy9/{base,branch}).
set -u
B=/work/main/.venv/bin
T=/tmp/proxy9
R=/work/wt/proxy/benchmarks/results
q() {  # name, dir, command...
  local name=$1 dir=$2; shift 2
  cd "$dir" && PYTHONPATH=$dir /tmp/s9/inquiet.sh bash -c "echo $name-start \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) >> $T/quiet_times.txt; timeout 180 $* > $T/$name.out 2> $T/$name.err; echo $name-end \$(date -u +%H:%M:%S) rc \$? load \$(cut -d' ' -f1-3 /proc/loadavg) >> $T/quiet_times.txt"
}
for i in 1 2 3 4; do
  for side in base branch; do
    q ab2-$side-$i $T/$side $B/pdorch bench proxy --requests 3000 --concurrency 1,32 --rounds 2 --targets vllm-router,pdorch-native --json --out $R/proxy-9-ab/ab2-$side-$i.json
  done
done
echo done2 >> $T/quiet_times.txt
