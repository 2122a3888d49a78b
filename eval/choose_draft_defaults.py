#!/usr/bin/env python3
"""Chooses the drafter's settings leave-one-workload-out, and reports each workload's replay beside
SuffixDecoding's best configuration on it.

Each workload is a recorded run of `infini-sidecar eval workload` (its folder holds replay.json, the
greedy outputs, and workload.json, whose simulated replays include SuffixDecoding's eight
configurations when the run was given `--suffix-decoding-python`). Every setting of the grid is
replayed over every workload's outputs (`eval workload --replay`, all sources, the same cost model);
then, for each workload, the setting with the best geometric mean of warm speed-ups over the *other*
workloads is the one it is judged by. The setting best over all workloads is the candidate for the
defaults (src/draft/mod.rs says which are kept, and why). Writes loo.json and loo.md to --out-dir. Usage:

  python3 eval/choose_draft_defaults.py --binary target/release/infini-sidecar --model SmolLM2.gguf \
    --index INDEX --workload agentic=eval/workloads/agentic.jsonl:eval/results/workload ... \
    --out-dir eval/results/draft-defaults
"""

import argparse
import concurrent.futures
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile

# The grid: the settings `eval workload` takes, each over the values worth trying. Drafts of at
# most 15 tokens and trees were tried on these workloads too and lost 0.1–0.5× everywhere (trees
# pay for their branches' rows): eval/RESULTS.md.
GRID = {
    "max_draft": [31],
    "min_path_prob": [0.15, 0.2, 0.3],
    "min_token_prob": [0.2, 0.4],
    "match_len_factor": [1.0],
    "long_match": [0, 12],
    "tree": [False],
}


def name_of(setting):
    shape = "tree" if setting["tree"] else "chain"
    return (
        f"{shape} {setting['max_draft']}, path {setting['min_path_prob']}, "
        f"token {setting['min_token_prob']}, match×{setting['match_len_factor']}, "
        f"long {setting['long_match']}"
    )


def replay(args, workload, replay_json, setting):
    """Warm, cold and whole speed-ups of our all-sources replay under `setting`."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            args.binary, "eval", "workload", "--model", args.model, "--index", args.index,
            "--workload", workload, "--replay", replay_json, "--out-dir", out,
            "--max-draft", str(setting["max_draft"]),
            "--min-path-prob", str(setting["min_path_prob"]),
            "--min-token-prob", str(setting["min_token_prob"]),
            "--match-len-factor", str(setting["match_len_factor"]),
            "--long-match", str(setting["long_match"]),
            "--row-cost", str(args.row_cost),
        ] + (["--tree"] if setting["tree"] else [])
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        with open(os.path.join(out, "simulated.json")) as f:
            rows = json.load(f)["simulated"]
    return {r["part"]: r["speedup"] for r in rows if r["configuration"] == "ours: all"}


def suffix_best(folder):
    """SuffixDecoding's best configuration on the warm fifth of a recorded run, and its speed-ups."""
    with open(os.path.join(folder, "workload.json")) as f:
        rows = json.load(f)["simulated"]
    by_config = {}
    for r in rows:
        if r["configuration"].startswith("suffix-decoding"):
            by_config.setdefault(r["configuration"], {})[r["part"]] = r["speedup"]
    if not by_config:
        sys.exit(f"{folder}/workload.json has no SuffixDecoding replay: run it with --suffix-decoding-python")
    best = max(by_config, key=lambda c: by_config[c]["warm"])
    return best, by_config[best]


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--index", required=True)
    ap.add_argument("--workload", action="append", required=True,
                    help="NAME=WORKLOAD.jsonl:RUN_FOLDER (repeat; at least two)")
    ap.add_argument("--row-cost", type=float, default=0.2)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="replays run at once")
    args = ap.parse_args()
    workloads = {}
    for w in args.workload:
        name, rest = w.split("=", 1)
        path, folder = rest.split(":", 1)
        workloads[name] = (path, folder)
    if len(workloads) < 2:
        sys.exit("leaving one out needs at least two workloads")
    settings = [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]
    results = []  # per setting: {workload: {part: speed-up}}
    # A failed replay ends the run at once: the replays not yet begun are dropped.
    pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
    try:
        pending = [
            {
                name: pool.submit(replay, args, path, os.path.join(folder, "replay.json"), setting)
                for name, (path, folder) in workloads.items()
            }
            for setting in settings
        ]
        for i, (setting, futures) in enumerate(zip(settings, pending)):
            per = {name: f.result() for name, f in futures.items()}
            results.append(per)
            warm = ", ".join(f"{n} {p['warm']:.2f}×" for n, p in per.items())
            print(f"[{i + 1}/{len(settings)}] {name_of(setting)}: {warm}", file=sys.stderr, flush=True)
    finally:
        pool.shutdown(cancel_futures=True)

    def best_over(names):
        return max(range(len(settings)), key=lambda s: geomean([results[s][n]["warm"] for n in names]))

    table = []
    for held_out, (_, folder) in workloads.items():
        chosen = best_over([n for n in workloads if n != held_out])
        suffix_config, suffix = suffix_best(folder)
        ours = results[chosen][held_out]
        table.append({
            "workload": held_out,
            "chosen_without_it": settings[chosen],
            "ours": ours,
            "best_on_it": results[best_over([held_out])][held_out],
            "suffix_decoding_best": suffix_config,
            "suffix_decoding": suffix,
            "ratio_warm": ours["warm"] / suffix["warm"],
        })
    default = best_over(list(workloads))
    report = {
        "grid": GRID,
        "row_cost": args.row_cost,
        "default": settings[default],
        "leave_one_out": table,
        "settings": [{"setting": s, "speedups": r} for s, r in zip(settings, results)],
    }
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "loo.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = [
        f"Cost model: a step costs 1 + {args.row_cost} × rows drafted. Warm = the last fifth.",
        "",
        "| workload | settings chosen without it | ours: warm (cold, all) | best on it alone: warm "
        "| SuffixDecoding's best on it | its warm (cold, all) | ours ÷ its, warm |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in table:
        o, s = row["ours"], row["suffix_decoding"]
        md.append(
            f"| {row['workload']} | {name_of(row['chosen_without_it'])} "
            f"| {o['warm']:.2f}× ({o['cold']:.2f}×, {o['all']:.2f}×) | {row['best_on_it']['warm']:.2f}× "
            f"| {row['suffix_decoding_best'].removeprefix('suffix-decoding ')} "
            f"| {s['warm']:.2f}× ({s['cold']:.2f}×, {s['all']:.2f}×) | {row['ratio_warm']:.3f} |"
        )
    md += ["", f"Best over every workload: {name_of(settings[default])}."]
    with open(os.path.join(args.out_dir, "loo.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
