#!/usr/bin/env bash
# The main job on the embedded default, end to end: fetch SmolLM2 and the mini-Pile (if absent), build
# the ∞-gram index over the mini-Pile train split with SmolLM2's tokenizer (if absent), and query it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python3 scripts/fetch_assets.py
cargo build --release --quiet
BIN="$CARGO_TARGET_DIR/release/infini-sidecar"
if [ ! -f "$DEFAULT_INDEX/sidecar-index.json" ]; then
  "$BIN" index build --input "$INFINI_SIDECAR_ASSETS/minipile/train.jsonl" --tokenizer "$SMOLLM2_GGUF" \
    --out "$DEFAULT_INDEX" --memory-gib 4
fi
"$BIN" index info --index "$DEFAULT_INDEX"
prompt=$("$BIN" tokenize --tokenizer "$SMOLLM2_GGUF" --text "The kernel uses a")
echo "queries for the prompt \"The kernel uses a\" = $prompt:"
printf '%s\n' \
  "{\"qid\":\"count\",\"op\":\"count\",\"ids\":$prompt}" \
  "{\"qid\":\"infgram\",\"op\":\"infgram_ntd\",\"prompt\":$prompt}" \
  "{\"qid\":\"score\",\"op\":\"score\",\"ids\":$prompt}" \
  | "$BIN" query --index "$DEFAULT_INDEX" --timing | cut -c1-400
