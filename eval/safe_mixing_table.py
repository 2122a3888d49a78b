#!/usr/bin/env python3
"""The tables of eval/RESULTS.md's safe-mixing section, from the reports eval/run_safe_mixing.sh writes:
per domain, the neural perplexity and each rule's Δ with the shares of tokens it helped and hurt (log-prob
moved by over 1%, in percent); in-domain (test split), held-out domains, and leave-one-domain-out.

    python3 eval/safe_mixing_table.py eval/results/mixing/report.json eval/results/safe-mixing
"""
import json
import os
import sys

RULES = [("split", "λ1/λ2"), ("domain_split", "domain λ1/λ2"), ("gate", "gate"), ("adaptive", "adaptive")]


def row(s, default):
    cells = [s["domain"], str(s["tokens_scored"]), f"{s['neural_perplexity']:.2f}"]
    for key, _ in RULES:
        d = s.get(f"{key}_improvement")
        hh = s["helped_hurt"].get(key)
        mark = "**" if key == default else ""
        shares = "" if hh is None else f" ({hh['helped'] * 100:.0f} / {hh['hurt'] * 100:.0f})"
        cells.append("–" if d is None else f"{mark}{d:+.1f}%{mark}{shares}")
    return "| " + " | ".join(cells) + " |"


def table(title, summaries, default):
    head = ["domain", "tokens", "neural PPL"] + [f"Δ {name} (helped / hurt %)" for _, name in RULES]
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [row(s, default) for s in summaries]
    return "\n".join(lines) + "\n"


def main():
    in_domain, out_dir = sys.argv[1], sys.argv[2]
    report = json.load(open(in_domain))
    default = report["default_rule"]
    print(table("In-domain (mini-Pile test split)", report["by_domain"] + [report["total"]], default))
    held = json.load(open(os.path.join(out_dir, "heldout", "report.json")))
    print(table("Held-out domains (neither indexed nor fitted on)", held["by_domain"] + [held["total"]], default))
    lodo_dir = os.path.join(out_dir, "lodo")
    rows = []
    for d in sorted(os.listdir(lodo_dir)):
        r = json.load(open(os.path.join(lodo_dir, d, "report.json")))
        rows += r["by_domain"]
    print(table("Leave-one-domain-out (fitted on the other four domains' validation text)", rows, default))


if __name__ == "__main__":
    main()
