#!/usr/bin/env bash
# pdorch bench live replaying the same Mooncake slice (arrivals at the trace's timestamps,
# prompts rendered from its hash_ids, ignore_eos so outputs are the trace's lengths), on
# /v1/completions like vllm bench serve. Usage: run-pdorch-bench-live.sh URL
set -euo pipefail
URL=${1:?base url of pdorch serve}
HERE=$(cd "$(dirname "$0")" && pwd)
nice -n 5 "${PDORCH:-pdorch}" bench live --url "$URL" --trace "$HERE/mooncake-first11.jsonl" \
  --trace-format mooncake --rate-scale 0.25 --api completions --json --out "$HERE/pdorch-bench-live"
