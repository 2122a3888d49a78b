#!/usr/bin/env python3
"""PNG plots of an `infini-sidecar eval ppl --out-dir DIR` report: ∞-gram agreement by effective n
(as the paper's Figure 3) and perplexity against a fixed λ, with the fitted λ1/λ2 and gate marked.

    python3 eval/plot_ppl.py DIR/report.json   # writes DIR/agreement_by_n.png and DIR/ppl_vs_lambda.png

Needs matplotlib (`pip install matplotlib`).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    report = json.load(open(path))
    out = os.path.dirname(os.path.abspath(path))

    points = report["agreement_by_n"]
    n = [p["effective_n"] for p in points]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(n, [100 * p["agreement"] for p in points], "o-", label="all estimates")
    sparse = [(p["effective_n"], 100 * p["agreement_sparse"]) for p in points if p["sparse_tokens"] > 0]
    ax.plot([s[0] for s in sparse], [s[1] for s in sparse], "s--", label="sparse estimates")
    ax.set_xlabel("effective n (last bucket: ≥ %d)" % n[-1])
    ax.set_ylabel("agreement: P∞(true token) > 0.5 (%)")
    ax.set_title("∞-gram agreement by effective n")
    ax2 = ax.twinx()
    ax2.bar(n, [p["tokens"] for p in points], alpha=0.15, color="gray")
    ax2.set_ylabel("tokens")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "agreement_by_n.png"), dpi=120)

    lam = report["perplexity_by_lambda"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([l for l, _ in lam], [p for _, p in lam], "o-", label="fixed λ")
    total = report["total"]
    ax.axhline(total["split_perplexity"], color="C1", ls="--",
               label="λ1=%.2f / λ2=%.2f: %.2f" % (report["lambda_sparse"], report["lambda_dense"],
                                                  total["split_perplexity"]))
    if total.get("gate_perplexity"):
        ax.axhline(total["gate_perplexity"], color="C2", ls=":", label="gate: %.2f" % total["gate_perplexity"])
    ax.set_xlabel("λ (weight of the ∞-gram)")
    ax.set_ylabel("perplexity")
    ax.set_yscale("log")
    ax.set_title("Mixed perplexity against λ (λ = 0: neural alone)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ppl_vs_lambda.png"), dpi=120)
    print("wrote", os.path.join(out, "agreement_by_n.png"), "and", os.path.join(out, "ppl_vs_lambda.png"))


if __name__ == "__main__":
    main()
