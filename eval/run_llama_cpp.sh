#!/usr/bin/env bash
# llama.cpp with the sidecar beside it (eval/llama_cpp_sidecar.py): a sidecar on the default index and
# mixing file, then speculative decoding with sidecar drafts against plain llama.cpp and its own
# prompt-lookup drafter, and mixing through the logits processor.
# Results: eval/results/llama-cpp/report.json. Extra arguments go to the Python script.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python3 scripts/fetch_assets.py
ensure_client_python
cargo build --release --quiet
start_sidecar 50077
"$SIDECAR_PYTHON" eval/llama_cpp_sidecar.py --addr 127.0.0.1:50077 --model "$SMOLLM2_GGUF" \
  --input "$INFINI_SIDECAR_ASSETS/minipile/test.jsonl" --out eval/results/llama-cpp/report.json "$@"
