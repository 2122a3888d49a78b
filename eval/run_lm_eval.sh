#!/usr/bin/env bash
# lm-evaluation-harness through the sidecar (`infini-sidecar-lm-eval`, the package's `sidecar_pile`
# tasks) beside `infini-sidecar eval ppl` on the same documents: the first 1,500 characters of the
# first DOCS documents of each mini-Pile domain. Both runs, and eval/lm_eval_vs_eval_ppl.py's table of
# their summed log-loss per domain, go to eval/results/lm-eval/.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python3 scripts/fetch_assets.py
ensure_client_python
cargo build --release --quiet
OUT=eval/results/lm-eval
DOCS="${DOCS:-4}"
mkdir -p "$OUT"
"$SIDECAR_PYTHON" - "$INFINI_SIDECAR_ASSETS/minipile/test.jsonl" "$OUT/documents.jsonl" "$DOCS" <<'PY'
import json, sys
src, dst, per_domain = sys.argv[1], sys.argv[2], int(sys.argv[3])
seen = {}
with open(dst, "w") as out:
    for line in open(src):
        doc = json.loads(line)
        domain = doc["meta"]["pile_set_name"]
        if seen.get(domain, 0) < per_domain:
            seen[domain] = seen.get(domain, 0) + 1
            out.write(json.dumps({"text": doc["text"][:1500], "meta": doc["meta"]}) + "\n")
PY
WITH_MODEL=1 start_sidecar 50078
for mode in mixed neural; do
  HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$SIDECAR_PYTHON" -m infini_sidecar.lm_eval run \
    --model infini-sidecar --model_args addr=127.0.0.1:50078 "mode=$mode" --tasks sidecar_pile \
    --metadata "{\"path\": \"$OUT/documents.jsonl\"}" --output_path "$OUT/lm-eval-$mode"
done
"$CARGO_TARGET_DIR/release/infini-sidecar" eval ppl --model "$SMOLLM2_GGUF" --index "$DEFAULT_INDEX" \
  --mixing eval/results/mixing/mixing.json --input "$OUT/documents.jsonl" --out-dir "$OUT/eval-ppl"
"$SIDECAR_PYTHON" eval/lm_eval_vs_eval_ppl.py "$OUT" | tee "$OUT/comparison.md"
