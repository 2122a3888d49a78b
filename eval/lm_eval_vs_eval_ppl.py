"""The summed log-loss per domain by lm_eval (bits per byte × bytes × ln 2) and by `eval ppl`
(ln perplexity × tokens scored) on the same documents, as a Markdown table (eval/run_lm_eval.sh)."""
import glob
import json
import math
import sys
from pathlib import Path

out = Path(sys.argv[1])
docs = [json.loads(l) for l in open(out / "documents.jsonl")]
report = {d["domain"]: d for d in json.load(open(out / "eval-ppl/report.json"))["by_domain"]}
rows = []
for mode, key in [("mixed", "default_perplexity"), ("neural", "neural_perplexity")]:
    files = sorted(glob.glob(str(out / f"lm-eval-{mode}/**/results_*.json"), recursive=True))
    results = json.load(open(files[-1]))["results"]
    for domain in sorted(report):
        nbytes = sum(len(d["text"].encode()) for d in docs if d["meta"]["pile_set_name"] == domain)
        r = results[f"sidecar_pile_{domain.replace('-', '_')}"]
        lm_eval_nll = r["bits_per_byte,none"] * nbytes * math.log(2)
        ours = math.log(report[domain][key]) * report[domain]["tokens_scored"]
        rows.append(f"| {mode} | {domain} | {r['word_perplexity,none']:.2f} | {r['byte_perplexity,none']:.4f} | "
                    f"{r['bits_per_byte,none']:.4f} | {report[domain][key]:.3f} | {lm_eval_nll:.6f} | {ours:.6f} | "
                    f"{abs(lm_eval_nll / ours - 1):.1e} |")
print("| mode | domain | lm_eval word ppl | byte ppl | bits/byte | eval ppl token ppl | lm_eval NLL (nats) | "
      "eval ppl NLL (nats) | relative difference |")
print("|---|---|---|---|---|---|---|---|---|")
print("\n".join(rows))
