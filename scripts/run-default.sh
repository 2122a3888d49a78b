#!/usr/bin/env bash
# The main job on the embedded default, end to end: fetch SmolLM2 and the mini-Pile (if absent), build
# the ∞-gram index over the mini-Pile train split with SmolLM2's tokenizer, decontaminated against the
# evaluation splits (if absent), query it, then fit λ on validation text and report neural vs mixed
# perplexity on test text (a small token budget; eval/run_mixing.sh runs the full experiment).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python3 scripts/fetch_assets.py
cargo build --release --quiet
BIN="$CARGO_TARGET_DIR/release/infini-sidecar"
if [ ! -f "$DEFAULT_INDEX/sidecar-index.json" ]; then
  echo "== building the index (once)"
  "$BIN" index build --input "$INFINI_SIDECAR_ASSETS/minipile/train.jsonl" --tokenizer "$SMOLLM2_GGUF" \
    --out "$DEFAULT_INDEX" --memory-gib 4 \
    --decontaminate "$INFINI_SIDECAR_ASSETS/minipile/test.jsonl" "$INFINI_SIDECAR_ASSETS/minipile/validation.jsonl"
fi
echo "== the index"
"$BIN" index info --index "$DEFAULT_INDEX"
prompt=$("$BIN" tokenize --tokenizer "$SMOLLM2_GGUF" --text "The kernel uses a")
echo
echo "== queries for the prompt \"The kernel uses a\" = $prompt (JSON lines, cut to 400 characters):"
printf '%s\n' \
  "{\"qid\":\"count\",\"op\":\"count\",\"ids\":$prompt}" \
  "{\"qid\":\"infgram\",\"op\":\"infgram_ntd\",\"prompt\":$prompt}" \
  "{\"qid\":\"score\",\"op\":\"score\",\"ids\":$prompt}" \
  | "$BIN" query --index "$DEFAULT_INDEX" --timing | cut -c1-400

WORK="$CACHE/run-default"
mkdir -p "$WORK"
echo
echo "== mixing fitted on validation text"
"$BIN" eval fit --model "$SMOLLM2_GGUF" --index "$DEFAULT_INDEX" \
  --input "$INFINI_SIDECAR_ASSETS/minipile/validation.jsonl" --max-tokens 400 \
  --work-dir "$WORK/validation" --out "$WORK/mixing.json"
echo
echo "== perplexity on test text"
"$BIN" eval ppl --model "$SMOLLM2_GGUF" --index "$DEFAULT_INDEX" --mixing "$WORK/mixing.json" \
  --input "$INFINI_SIDECAR_ASSETS/minipile/test.jsonl" --max-tokens 400 \
  --work-dir "$WORK/test" --out-dir "$WORK/report"
echo
echo "== the JSON (--json prints a command's report as JSON instead of its summary):"
echo "  the index's manifest     $DEFAULT_INDEX/sidecar-index.json"
echo "  the mixing file          $WORK/mixing.json"
echo "  the perplexity report    $WORK/report/report.json (every column: $WORK/report/report.md)"
