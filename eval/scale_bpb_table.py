"""Bits per byte on the mini-Pile test sample, per domain: the byte index of the mini-Pile train
split (50.7 MB) beside the gigabyte one (the same split and 4.38 GB of Debian sources, both
decontaminated with 48-byte n-grams), mixed with SmolLM2-135M and with Gemma-3-270M (gate and the
default adaptive rule), and each model alone.

    python3 eval/scale_bpb_table.py eval/results/standalone eval/results/scale
"""
import json
import os
import sys

standalone, scale = sys.argv[1], sys.argv[2]


def report(path):
    with open(path) as f:
        r = json.load(f)
    rows = {d["domain"]: d["bits_per_byte"] for d in r["by_domain"]}
    rows["all"] = r["total"]["bits_per_byte"]
    return rows


with open(f"{standalone}/minipile-gemma3.json") as f:
    g = json.load(f)
gemma = {d: v["bits_per_byte"] for d, v in g["by_domain"].items()}
gemma["all"] = g["total"]["bits_per_byte"]
small = {m: report(f"{standalone}/minipile-bytes-{m}/report.json") for m in ["smollm2", "gemma3"]}
# A model not yet run with the gigabyte index has no columns for it.
big = {
    m: report(f"{scale}/bpb-{m}/report.json")
    for m in ["smollm2", "gemma3"]
    if os.path.exists(f"{scale}/bpb-{m}/report.json")
}
columns = [("Gemma-3 alone", lambda d: gemma[d]), ("SmolLM2 alone", lambda d: small["smollm2"][d]["neural"])]
for model, label in [("smollm2", "SmolLM2"), ("gemma3", "Gemma-3")]:
    for rule in ["gate", "adaptive"]:
        columns.append((f"{label} + mini-Pile bytes, {rule}", lambda d, m=model, r=rule: small[m][d][r]))
        if model in big:
            columns.append((f"{label} + 4.4 GB bytes, {rule}", lambda d, m=model, r=rule: big[m][d][r]))
print("| domain | " + " | ".join(name for name, _ in columns) + " |")
print("|---" * (len(columns) + 1) + "|")
for domain in list(g["by_domain"]) + ["all"]:
    values = [f(domain) for _, f in columns]
    best = min(values)
    cells = [f"**{v:.4f}**" if v == best else f"{v:.4f}" for v in values]
    print(f"| {domain} | " + " | ".join(cells) + " |")
