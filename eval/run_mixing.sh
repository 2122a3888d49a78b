#!/usr/bin/env bash
# The mixing experiment of eval/RESULTS.md: SmolLM2-135M + an ∞-gram index over the mini-Pile train
# split (decontaminated against test and validation), λ1/λ2 and the gate fitted on validation, reported
# on test, all five domains. TOKENS (default 6000) caps the tokens scored per domain and split, and
# DOC_TOKENS (default 1000) those of one document, so each domain's sample spans several documents.
#
#   bash eval/run_mixing.sh [TOKENS [DOC_TOKENS]]      # writes eval/results/mixing/{mixing.json,fit.json,report.*,*.png}
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
TOKENS="${1:-6000}"
DOC_TOKENS="${2:-1000}"
python3 scripts/fetch_assets.py
cargo build --release --quiet --bin infini-sidecar
BIN="$CARGO_TARGET_DIR/release/infini-sidecar"
A="$INFINI_SIDECAR_ASSETS/minipile"
if [ ! -f "$DEFAULT_INDEX/sidecar-index.json" ]; then
  "$BIN" index build --input "$A/train.jsonl" --tokenizer "$SMOLLM2_GGUF" --out "$DEFAULT_INDEX" \
    --memory-gib 4 --decontaminate "$A/test.jsonl" "$A/validation.jsonl"
fi
OUT=eval/results/mixing
WORK="$CACHE/mixing-$TOKENS-$DOC_TOKENS"   # per-domain token records: an interrupted run resumes from here
mkdir -p "$OUT"
"$BIN" eval fit --model "$SMOLLM2_GGUF" --index "$DEFAULT_INDEX" --input "$A/validation.jsonl" \
  --max-tokens "$TOKENS" --max-doc-tokens "$DOC_TOKENS" --work-dir "$WORK/validation" --out "$OUT/mixing.json" --json > "$OUT/fit.json"
"$BIN" eval ppl --model "$SMOLLM2_GGUF" --index "$DEFAULT_INDEX" --mixing "$OUT/mixing.json" \
  --input "$A/test.jsonl" --max-tokens "$TOKENS" --max-doc-tokens "$DOC_TOKENS" --work-dir "$WORK/test" --out-dir "$OUT"
PLOT_PYTHON="$CACHE/venv-plot/bin/python"
if ! "$PLOT_PYTHON" -c 'import matplotlib' 2>/dev/null; then
  python3 -m venv "$CACHE/venv-plot" && "$PLOT_PYTHON" -m pip install -q matplotlib
fi
"$PLOT_PYTHON" eval/plot_ppl.py "$OUT/report.json"
