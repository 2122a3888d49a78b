#!/usr/bin/env bash
# The test suite, on a fresh machine: fetches the real assets and the reference engine if absent,
# checks formatting and lints, runs every test with nextest, then fuzzes each target for a bounded time.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python3 scripts/fetch_assets.py
ensure_reference_engine
ensure_client_python
ensure_vllm_model
ensure_deploy_tools
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
# Clippy only type-checks and the tests build machine code: they share no artifacts, so they run side
# by side, clippy in a target dir of its own. The second core would otherwise idle through the long
# serial stretches of the dependency graph (candle-core, then candle-nn, then our crate).
clippy_log="$(mktemp)"
CARGO_TARGET_DIR="$CACHE/target-clippy" cargo clippy --all-targets --quiet -- -D warnings \
  >"$clippy_log" 2>&1 &
clippy=$!
if ! cargo nextest run --no-run --cargo-quiet; then
  wait "$clippy" || true
  cat "$clippy_log"
  exit 1
fi
clippy_status=0
wait "$clippy" || clippy_status=$?
cat "$clippy_log"
rm -f "$clippy_log"
if [ "$clippy_status" != 0 ]; then
  echo "clippy failed"
  exit "$clippy_status"
fi
cargo nextest run --no-fail-fast
bash scripts/fuzz.sh
