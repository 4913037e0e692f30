#!/usr/bin/env bash
cd /tmp/edge10/main && PYTHONPATH=$PWD /work/main/.venv/bin/python -m benchmarks.proxy.edge_micro_main 20000 > /tmp/edge10/micro-main.txt 2>&1
cd /work/wt/edge && PYTHONPATH=$PWD /work/main/.venv/bin/python -m benchmarks.proxy.edge_micro 20000 > /tmp/edge10/micro-branch.txt 2>&1
uptime >> /tmp/edge10/micro-branch.txt
