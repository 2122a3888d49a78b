#!/usr/bin/env bash
# The ∞-gram on its own and bits per byte across tokenizers (eval/RESULTS.md, issue 22):
# - the tiny-infini-gram table at byte level: a byte index over the mini-Pile's Shakespeare train
#   works, selective back-off scored for k = 1, 2, 3, 5, all on validation, train and (cut) test;
# - SmolLM2 and SmolLM2 + ∞-gram (a SmolLM2-token index over the same works, mixing fitted on
#   validation) on the same test text, in bits per byte, and Gemma-3 alone;
# - bits per byte on the mini-Pile test split (the first 6 documents of each domain, 3,000 bytes of
#   each, so every model scores the same text): Gemma-3-270M alone, SmolLM2-135M alone and mixed
#   with the default index (eval/results/mixing/mixing.json), the standalone ∞-gram on that index.
#
#   bash eval/run_standalone.sh          # writes eval/results/standalone/
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python3 scripts/fetch_assets.py
cargo build --release --quiet --bin infini-sidecar
BIN="$CARGO_TARGET_DIR/release/infini-sidecar"
A="$INFINI_SIDECAR_ASSETS"
GEMMA="$A/gemma3/gemma-3-270m-q4_k_m.gguf"
OUT=eval/results/standalone
WORK="$CACHE/standalone"
mkdir -p "$OUT" "$WORK"
# Shakespeare's splits, test cut to 20,000 bytes a work; the mini-Pile test sample.
python3 eval/cut_samples.py "$A/minipile" "$WORK"
S="$WORK/shakespeare"
"$BIN" index build --bytes --input "$S-train.jsonl" --out "$WORK/idx-bytes" --force
"$BIN" index build --input "$S-train.jsonl" --tokenizer "$SMOLLM2_GGUF" --out "$WORK/idx-smollm2" --force
for split in validation test; do
  "$BIN" eval backoff --index "$WORK/idx-bytes" --input "$S-$split.jsonl" --output "$OUT/backoff-shakespeare-$split.json"
done
"$BIN" eval backoff --index "$WORK/idx-bytes" --input "$S-train.jsonl" --max-tokens 100000 --generate 0 \
  --output "$OUT/backoff-shakespeare-train.json"
"$BIN" eval backoff --index "$WORK/idx-bytes" --input "$S-validation.jsonl" --weighting distributions --generate 0 \
  --output "$OUT/backoff-shakespeare-validation-distributions.json"
"$BIN" eval fit --model "$SMOLLM2_GGUF" --index "$WORK/idx-smollm2" --input "$S-validation.jsonl" \
  --work-dir "$WORK/records-validation" --out "$OUT/shakespeare-mixing.json"
"$BIN" eval ppl --model "$SMOLLM2_GGUF" --index "$WORK/idx-smollm2" --mixing "$OUT/shakespeare-mixing.json" \
  --input "$S-test.jsonl" --work-dir "$WORK/records-test" --out-dir "$OUT/shakespeare-smollm2"
"$BIN" model score --model "$GEMMA" --input "$S-test.jsonl" --summary --output "$OUT/shakespeare-gemma3.json"
M="$WORK/minipile-test-sample.jsonl"
"$BIN" eval ppl --model "$SMOLLM2_GGUF" --index "$DEFAULT_INDEX" --mixing eval/results/mixing/mixing.json \
  --input "$M" --work-dir "$WORK/records-minipile" --out-dir "$OUT/minipile-smollm2"
"$BIN" model score --model "$GEMMA" --input "$M" --summary --output "$OUT/minipile-gemma3.json"
"$BIN" eval backoff --index "$DEFAULT_INDEX" --input "$M" --generate 0 --output "$OUT/minipile-backoff-smollm2-index.json"
# One byte index of the mini-Pile train split, decontaminated as the token index is (48-byte n-grams
# for its 13 tokens), mixed with SmolLM2 and with Gemma-3: λ1/λ2 and the gate fitted on a
# validation sample cut as the test sample is, then bits per byte on the test sample.
BYTES="$WORK/idx-minipile-bytes"
if [ ! -f "$BYTES/sidecar-index.json" ]; then
  "$BIN" index build --bytes --input "$A/minipile/train.jsonl" --out "$BYTES" --memory-gib 4 \
    --decontaminate "$A/minipile/test.jsonl" "$A/minipile/validation.jsonl" --decontaminate-ngram 48
fi
for pair in "smollm2:$SMOLLM2_GGUF" "gemma3:$GEMMA"; do
  name="${pair%%:*}" model="${pair#*:}"
  "$BIN" eval fit --model "$model" --index "$BYTES" --input "$WORK/minipile-validation-sample.jsonl" \
    --work-dir "$WORK/records-bytes-$name-validation" --out "$OUT/minipile-bytes-$name-mixing.json"
  "$BIN" eval ppl --model "$model" --index "$BYTES" --mixing "$OUT/minipile-bytes-$name-mixing.json" \
    --input "$M" --work-dir "$WORK/records-bytes-$name-test" --out-dir "$OUT/minipile-bytes-$name"
done
