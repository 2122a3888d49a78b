#!/usr/bin/env bash
# vLLM with the sidecar beside it (eval/vllm_sidecar.py): a sidecar on the default index and mixing
# file, then a workload through vLLM's engine with plain decoding, vLLM's `ngram` and `suffix`
# drafters and the sidecar's (`infini_sidecar.vllm.SidecarProposer`), at concurrency 1 and 8, and
# round-robin over two engines; then the table. vLLM's CPU build binds its model worker to one core
# and its engine loop polls on either while it waits; the sidecar shares the machine with both.
# Results: eval/results/vllm/ (one JSON per run, table.md). Environment: WORKLOAD (default the
# agentic workload), OUT, CONCURRENCY (default "1 8"; empty: none), METHODS (default "plain ngram suffix
# sidecar"), REPLICAS (default 1: the two-engine runs of plain, suffix and the sidecar; 0 skips
# them), ROUNDS (default 1: more runs every method in turn again, named NAME-round2 and so on, so
# methods compared on a noisy host alternate); extra arguments go to every run (e.g. --limit 40,
# --dtype float32).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python3 scripts/fetch_assets.py
ensure_vllm_model
cargo build --release --quiet
SIDECAR_PYTHON="$VLLM_PYTHON" start_sidecar 50078
WORKLOAD="${WORKLOAD:-eval/workloads/agentic.jsonl}"
OUT="${OUT:-eval/results/vllm}"
mkdir -p "$OUT"
run() {
  local name="$1"
  shift
  # Each sidecar run learns into a namespace of its own, as each vLLM engine starts empty.
  "$VLLM_PYTHON" eval/vllm_sidecar.py run --model "$VLLM_MODEL" --workload "$WORKLOAD" \
    --addr 127.0.0.1:50078 --sidecar-pid "$SIDECAR_PID" --namespace "$name" --out "$OUT/$name.json" "$@" | tail -1
}
METHODS="${METHODS:-plain ngram suffix sidecar}"
if ! [[ "${ROUNDS:-1}" =~ ^[1-9][0-9]*$ ]]; then
  echo "run_vllm.sh: ROUNDS=$ROUNDS: a number of rounds, at least 1" >&2
  exit 2
fi
for round in $(seq "${ROUNDS:-1}"); do
  suffix=""
  [ "$round" = 1 ] || suffix="-round$round"
  for concurrency in ${CONCURRENCY-1 8}; do
    for method in $METHODS; do
      run "$method-c$concurrency$suffix" --method "$method" --concurrency "$concurrency" "$@"
    done
  done
  if [ "${REPLICAS:-1}" = 1 ]; then
    for method in $METHODS; do
      [ "$method" = ngram ] || run "$method-r2$suffix" --method "$method" --replicas 2 "$@"
    done
  fi
done
# The table: every run in OUT, this call's and any kept there before.
shopt -s nullglob
runs=("$OUT"/*-c*.json "$OUT"/*-r2*.json)
if [ "${#runs[@]}" -gt 0 ]; then
  "$VLLM_PYTHON" eval/vllm_sidecar.py table "${runs[@]}" >"$OUT/table.md"
  cat "$OUT/table.md"
fi
