#!/bin/bash
# A/B: main (2c83c02, exported: mkdir -p /tmp/pl/base && git archive 2c83c02 | tar -x -C /tmp/pl/base)
# vs proxy-lean-5 (e7c7b41, its worktree), alternated, each run with vllm-router as the normalizer
B=/work/main/.venv/bin
for i in 1 2 3 4; do  # run as two calls: 1 2, then 3 4
  for side in base branch; do
    if [ $side = base ]; then dir=/tmp/pl/base; else dir=/work/wt/proxy-lean; fi
    cd $dir
    PYTHONPATH=$dir /tmp/s9/inquiet.sh bash -c "echo ab-$side-$i-start \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) >> /tmp/pl/quiet_times.txt; $B/pdorch bench proxy --requests 1000 --concurrency 1,32 --rounds 2 --targets vllm-router,pdorch-native --json --out /tmp/pl/ab-$side-$i.json > /dev/null 2> /tmp/pl/ab-$side-$i.err; echo ab-$side-$i-end \$(date -u +%H:%M:%S) load \$(cut -d' ' -f1-3 /proc/loadavg) >> /tmp/pl/quiet_times.txt"
  done
done
echo ab-done >> /tmp/pl/quiet_times.txt
