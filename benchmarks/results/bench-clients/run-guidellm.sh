#!/usr/bin/env bash
# guidellm 0.8.1 (.bench-clients/guidellm, `make bench-clients`) replaying the Mooncake slice with its
# `mooncake` data source and `replay` profile at the file's timestamps: prompts synthesized per
# 512-token hash block with the local tokenizer (Faker text, equal ids, equal tokens), outputs of the
# trace's lengths (max_tokens + ignore_eos), streamed /v1/completions (the endpoint the other rows
# used; guidellm's default is /v1/chat/completions). The quarter-rate file is the slice with
# timestamps x4, in milliseconds as Mooncake writes them; guidellm's mooncake loader takes them as
# seconds (no unit conversion), so the replay profile's time_scale=0.001 turns them back into
# seconds (without it the slice spans 12,000 s and the run sits at "pending").
# Usage: run-guidellm.sh URL
set -euo pipefail
URL=${1:?base url of pdorch serve}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
cd "$ROOT"
OUT="$HERE/guidellm"
mkdir -p "$OUT"
# guidellm wants absolute paths inside its nested arguments.
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
nice -n 19 "${GUIDELLM:-.bench-clients/guidellm/bin/guidellm}" run \
  --backend "kind=openai_http,target=$URL,model=llama-3.1-8b,request_format=/v1/completions" \
  --profile kind=replay,schedule_turn=timestamp,time_scale=0.001 \
  --tokenizer "kind=huggingface_auto,model=$ROOT/.cache/tiny-model" \
  --data "{\"kind\": \"mooncake\", \"source\": {\"kind\": \"json_file\", \"path\": \"$HERE/mooncake-first11-quarter-rate.jsonl\"}}" \
  --output "kind=json,path=$OUT/benchmarks.json" --output kind=console \
  --disable-console-interactive
