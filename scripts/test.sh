#!/usr/bin/env bash
# The test suite, on a fresh machine: fetches the real assets and the reference engine if absent,
# checks formatting and lints, then runs every test with nextest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python3 scripts/fetch_assets.py
ensure_reference_engine
ensure_client_python
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings
cargo nextest run --no-fail-fast
