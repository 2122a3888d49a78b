#!/usr/bin/env bash
# The out-of-domain protocol of eval/RESULTS.md ("Mixing that is safe by default"), after
# eval/run_mixing.sh has written the default mixing file (fitted on all five domains' validation text):
#   1. text from outside the index's domains (scripts/fetch_assets.py heldout: quotations about
#      computers, verse, git's documentation), scored with the default mixing file;
#   2. leave-one-domain-out: for each mini-Pile domain, λ1/λ2 and the gate fitted on the other four's
#      validation text, reported on its test text.
# Token records are shared with eval/run_mixing.sh (same caps), so the model scores each text once.
#
#   bash eval/run_safe_mixing.sh [TOKENS [DOC_TOKENS]]    # writes eval/results/safe-mixing/
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
TOKENS="${1:-6000}"
DOC_TOKENS="${2:-1000}"
DOMAINS=(brown linux-doc perl-doc python-doc shakespeare)
python3 scripts/fetch_assets.py smollm2 minipile heldout
cargo build --release --quiet --bin infini-sidecar
BIN="$CARGO_TARGET_DIR/release/infini-sidecar"
A="$INFINI_SIDECAR_ASSETS"
WORK="$CACHE/mixing-$TOKENS-$DOC_TOKENS"
OUT=eval/results/safe-mixing
COMMON=(--model "$SMOLLM2_GGUF" --index "$DEFAULT_INDEX" --max-tokens "$TOKENS" --max-doc-tokens "$DOC_TOKENS")
mkdir -p "$OUT/heldout"
"$BIN" eval ppl "${COMMON[@]}" --mixing eval/results/mixing/mixing.json --input "$A/heldout/heldout.jsonl" \
  --work-dir "$WORK/heldout" --out-dir "$OUT/heldout"
for d in "${DOMAINS[@]}"; do
  others=()
  for o in "${DOMAINS[@]}"; do [ "$o" = "$d" ] || others+=(--exclude-domain "$o"); done
  mkdir -p "$OUT/lodo/$d" "$WORK/lodo/$d"
  # The mixing file (its forest is 1 MB) stays in the cache; its summary is kept.
  "$BIN" eval fit "${COMMON[@]}" --input "$A/minipile/validation.jsonl" --exclude-domain "$d" \
    --work-dir "$WORK/validation" --out "$WORK/lodo/$d/mixing.json" --json > "$OUT/lodo/$d/fit.json"
  "$BIN" eval ppl "${COMMON[@]}" --mixing "$WORK/lodo/$d/mixing.json" --input "$A/minipile/test.jsonl" \
    "${others[@]}" --work-dir "$WORK/test" --out-dir "$OUT/lodo/$d"
done
python3 eval/safe_mixing_table.py eval/results/mixing/report.json "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
