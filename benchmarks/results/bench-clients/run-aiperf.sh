#!/usr/bin/env bash
# aiperf 0.13.0 (.bench-clients/aiperf, `make bench-clients`) replaying the Mooncake slice with its
# mooncake_trace loader at the file's timestamps (fixed schedule): prompts synthesized per
# 512-token hash block with the local tokenizer, outputs of the trace's lengths (ignore_eos),
# streamed /v1/completions. The quarter-rate file is the slice with timestamps x4 (aiperf's
# --replay-speedup applies to the baseten loader only). Usage: run-aiperf.sh URL
set -euo pipefail
URL=${1:?base url of pdorch serve}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
cd "$ROOT"
# aiperf 0.13.0 cannot use a tokenizer directory for mooncake hash_ids synthesis: its decode
# workers force HF_HUB_OFFLINE=1, whose branch only loads hub-cache snapshots
# (snapshot_download(local_files_only=True)) and rejects a path. So the tiny tokenizer is laid
# out as a hub-cache entry, repo id pdorch/tiny-model, in .cache/hf-hub (files symlinked).
HUB="$ROOT/.cache/hf-hub"
SNAP="$HUB/models--pdorch--tiny-model/snapshots/0000000000000000000000000000000000000000"
mkdir -p "$SNAP" "$HUB/models--pdorch--tiny-model/refs"
echo -n 0000000000000000000000000000000000000000 > "$HUB/models--pdorch--tiny-model/refs/main"
for f in tokenizer.json tokenizer_config.json chat_template.jinja config.json; do
  ln -sf "$ROOT/.cache/tiny-model/$f" "$SNAP/$f"
done
HF_HUB_CACHE="$HUB" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
nice -n 5 "${AIPERF:-.bench-clients/aiperf/bin/aiperf}" profile \
  --model llama-3.1-8b --url "$URL" --endpoint-type completions --streaming \
  --tokenizer pdorch/tiny-model \
  --input-file "$HERE/mooncake-first11-quarter-rate.jsonl" --custom-dataset-type mooncake_trace \
  --fixed-schedule --extra-inputs ignore_eos:true \
  --ui-type simple --output-artifact-dir "$HERE/aiperf"
