#!/usr/bin/env bash
# Fuzzing for CI: every target of fuzz/ runs for FUZZ_SECONDS (default 60; 0 skips) from its kept
# corpus, where a nightly toolchain is (cargo-fuzz is installed if missing). Without nightly there is
# nothing to do here: the kept corpus and fuzz/regressions are replayed on stable through the same
# harness by the integration test fuzz_replay, which `cargo nextest run` runs everywhere.
# New inputs go to a temporary folder, so the clone's corpus is only read; a crash fails the run and
# leaves its input under fuzz/artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
FUZZ_SECONDS="${FUZZ_SECONDS:-60}"
if [ "$FUZZ_SECONDS" = 0 ]; then
  echo "fuzz: FUZZ_SECONDS=0, skipped"
  exit 0
fi
if ! cargo +nightly --version >/dev/null 2>&1; then
  echo "fuzz: no nightly toolchain; the kept corpus was replayed on stable (fuzz_replay tests)"
  exit 0
fi
if ! cargo fuzz --version >/dev/null 2>&1 && ! cargo install --locked cargo-fuzz; then
  echo "fuzz: cargo-fuzz could not be installed; the kept corpus was replayed on stable only"
  exit 0
fi
# Every dependency is rebuilt with coverage instrumentation: keep that build in the cache, apart from
# the stable one. No sanitizer: the code under test is safe Rust (bounds are checked anyway) and
# AddressSanitizer would halve the executions; outsized allocations are caught by the targets' own
# allocator (fuzz/src/lib.rs). Sixteen codegen units: cargo-fuzz's default of one made the build of
# the dependencies far slower for little speed in the targets.
FUZZ_FLAGS=(--sanitizer none --codegen-units 16 --target-dir "$CACHE/fuzz-target")
cargo +nightly fuzz build "${FUZZ_FLAGS[@]}"
# libFuzzer runs a target on one core: targets run side by side, FUZZ_JOBS at once (default one a
# core), each for FUZZ_SECONDS, and each one's output is printed whole when it ends. Stopped early,
# the run stops the targets still running.
FUZZ_JOBS="${FUZZ_JOBS:-$(nproc)}"
if ! [[ "$FUZZ_JOBS" =~ ^[1-9][0-9]*$ ]]; then
  echo "fuzz: FUZZ_JOBS=$FUZZ_JOBS: a number of targets at once, at least 1" >&2
  exit 2
fi
print_lock="$(mktemp)"
# Each target's cargo is a child of its job (its fuzzer, a child of cargo, ends by FUZZ_SECONDS).
trap 'for job in $(jobs -p); do pkill -P "$job"; kill "$job"; done 2>/dev/null; rm -f "$print_lock"' EXIT
fuzz_one() {
  local target=$1 new_inputs log status=0
  new_inputs="$(mktemp -d)"
  log="$(mktemp)"
  local dict=()
  if [ -f "fuzz/$target.dict" ]; then dict=(-dict="fuzz/$target.dict"); fi
  RUST_BACKTRACE=1 cargo +nightly fuzz run "${FUZZ_FLAGS[@]}" "$target" "$new_inputs" "fuzz/corpus/$target" -- \
    -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 "${dict[@]}" \
    >"$log" 2>&1 || status=$?
  flock "$print_lock" sh -c 'echo "fuzz: $1 for $2 s, exit status $3"; cat "$4"' _ "$target" "$FUZZ_SECONDS" "$status" "$log" \
    || cat "$log"
  rm -rf "$new_inputs" "$log"
  return "$status"
}
failed=0
running=0
for target in $(cargo +nightly fuzz list); do
  if [ "$running" -ge "$FUZZ_JOBS" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz_one "$target" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
exit "$failed"
