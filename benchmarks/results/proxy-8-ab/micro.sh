#!/bin/bash
B=/work/main/.venv/bin
T=/tmp/proxy8
echo micro-start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)
for i in 1 2 3; do
  for s in base branch; do
    cd $T/$s; echo -n "$s "; PYTHONPATH=$T/$s $B/python -m benchmarks.proxy.lifecycle_micro 5000
  done
done
cd $T/branch; PYTHONPATH=$T/branch $B/python -m benchmarks.proxy.deadline_micro 20000
echo micro-end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)
