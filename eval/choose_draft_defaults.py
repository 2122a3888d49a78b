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

With --drive VLLM_PYTHON the drafter is vLLM's (`infini_sidecar.vllm.SidecarProposer`, its settings
through the environment) driven over each run's outputs by `eval/vllm_sidecar.py drive` against the
sidecar on --addr, over DRIVE_GRID; a step costs 1 + --row-cost × tokens drafted, and the baseline is
the sidecar's own defaults instead of SuffixDecoding (each --workload is NAME=RUN_FOLDER):

  python3 eval/choose_draft_defaults.py --drive "$VLLM_PYTHON" --addr 127.0.0.1:50081 --row-cost 0.055 \
    --replicas 2 --workload agentic=eval/results/workload ... --out-dir eval/results/vllm-draft-defaults
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


# The grid for vLLM's drafter: its bars, each from the sidecar's defaults (first) down to where
# drafts grow longer than the evidence for them; chains of K tokens, K vLLM's.
DRIVE_GRID = {
    "min_path_prob": [0.2, 0.1, 0.05],
    "match_len_factor": [1.0, 2.0, 3.0],
    "min_token_prob": [0.4, 0.2],
}


def name_of(setting):
    if "max_draft" not in setting:
        return (f"path {setting['min_path_prob']}, token {setting['min_token_prob']}, "
                f"match×{setting['match_len_factor']}")
    shape = "tree" if setting["tree"] else "chain"
    return (
        f"{shape} {setting['max_draft']}, path {setting['min_path_prob']}, "
        f"token {setting['min_token_prob']}, match×{setting['match_len_factor']}, "
        f"long {setting['long_match']}"
    )


def run_for_json(cmd_into, name, env=None):
    """Runs the command `cmd_into(folder)` gives, writing into a fresh folder, and reads the JSON
    file `name` it wrote there. A failure ends the whole run: its grid point would be missing."""
    with tempfile.TemporaryDirectory() as out:
        cmd = cmd_into(out)
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
        with open(os.path.join(out, name)) as f:
            return json.load(f)


def replay(args, workload, replay_json, setting):
    """Warm, cold and whole speed-ups of our all-sources replay under `setting`."""
    rows = run_for_json(lambda out: [
        args.binary, "eval", "workload", "--model", args.model, "--index", args.index,
        "--workload", workload, "--replay", replay_json, "--out-dir", out,
        "--max-draft", str(setting["max_draft"]),
        "--min-path-prob", str(setting["min_path_prob"]),
        "--min-token-prob", str(setting["min_token_prob"]),
        "--match-len-factor", str(setting["match_len_factor"]),
        "--long-match", str(setting["long_match"]),
        "--row-cost", str(args.row_cost),
    ] + (["--tree"] if setting["tree"] else []), "simulated.json")["simulated"]
    return {r["part"]: r["speedup"] for r in rows if r["configuration"] == "ours: all"}


def drive(args, replay_json, setting):
    """Warm, cold and whole speed-ups of vLLM's drafter under `setting`, over a run's outputs: plain
    decoding's steps over (steps + row cost × tokens drafted); with the counts, to weigh again at
    another row cost."""
    env = dict(os.environ, **{f"INFINI_SIDECAR_{k.upper()}": str(v) for k, v in setting.items()})
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_sidecar.py")
    summary = run_for_json(lambda out: [
        args.drive, script, "drive", replay_json, "--addr", args.addr, "--k", str(args.k),
        "--replicas", str(args.replicas), "--out", os.path.join(out, "drive.json"),
    ], "drive.json", env)["summary"]
    speedups = {part: c["plain_steps"] / (c["steps"] + args.row_cost * c["drafted"])
                for part, c in summary.items()}
    return {**speedups, "counts": summary}


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
    ap.add_argument("--binary", help="the sidecar binary (`eval workload --replay`)")
    ap.add_argument("--model")
    ap.add_argument("--index")
    ap.add_argument("--drive", metavar="VLLM_PYTHON", help="vLLM's drafter, through `vllm_sidecar.py drive`")
    ap.add_argument("--addr", default="127.0.0.1:50051", help="the sidecar --drive drafts from")
    ap.add_argument("--k", type=int, default=16, help="--drive: num_speculative_tokens")
    ap.add_argument("--replicas", type=int, default=2, help="--drive: engines sharing the sidecar")
    ap.add_argument("--workload", action="append", required=True,
                    help="NAME=WORKLOAD.jsonl:RUN_FOLDER, or NAME=RUN_FOLDER with --drive (repeat; at least two)")
    ap.add_argument("--row-cost", type=float, default=0.2)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="replays run at once")
    args = ap.parse_args()
    if not args.drive and not (args.binary and args.model and args.index):
        sys.exit("--binary, --model and --index, or --drive")
    workloads = {}
    for w in args.workload:
        name, rest = w.split("=", 1)
        path, folder = rest.split(":", 1) if not args.drive else (None, rest)
        workloads[name] = (path, folder)
    if len(workloads) < 2:
        sys.exit("leaving one out needs at least two workloads")
    grid = DRIVE_GRID if args.drive else GRID
    settings = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]

    def run(path, folder, setting):
        replay_json = os.path.join(folder, "replay.json")
        return drive(args, replay_json, setting) if args.drive else replay(args, path, replay_json, setting)

    results = []  # per setting: {workload: {part: speed-up}}
    # A failed replay ends the run at once: the replays not yet begun are dropped.
    pool = concurrent.futures.ThreadPoolExecutor(args.jobs)
    try:
        pending = [
            {
                name: pool.submit(run, path, folder, setting)
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
        # --drive: the grid's first setting is the sidecar's defaults.
        baseline, theirs = (name_of(settings[0]), results[0][held_out]) if args.drive else suffix_best(folder)
        ours = results[chosen][held_out]
        table.append({
            "workload": held_out,
            "chosen_without_it": settings[chosen],
            "ours": ours,
            "best_on_it": results[best_over([held_out])][held_out],
            "baseline": baseline,
            "baseline_speedups": theirs,
            "ratio_warm": ours["warm"] / theirs["warm"],
        })
    default = best_over(list(workloads))
    report = {
        "grid": grid,
        "drafter": f"vLLM's (drive, K {args.k}, {args.replicas} engines)" if args.drive else "eval workload",
        "row_cost": args.row_cost,
        "default": settings[default],
        "leave_one_out": table,
        "settings": [{"setting": s, "speedups": r} for s, r in zip(settings, results)],
    }
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "loo.json"), "w") as f:
        json.dump(report, f, indent=1)
    baseline_heading = "the sidecar's defaults" if args.drive else "SuffixDecoding's best on it"
    md = [
        f"Drafter: {report['drafter']}. Cost model: a step costs 1 + {args.row_cost} × rows drafted. "
        "Warm = the last fifth.",
        "",
        "| workload | settings chosen without it | ours: warm (cold, all) | best on it alone: warm "
        f"| {baseline_heading} | its warm (cold, all) | ours ÷ its, warm |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in table:
        o, s = row["ours"], row["baseline_speedups"]
        md.append(
            f"| {row['workload']} | {name_of(row['chosen_without_it'])} "
            f"| {o['warm']:.2f}× ({o['cold']:.2f}×, {o['all']:.2f}×) | {row['best_on_it']['warm']:.2f}× "
            f"| {row['baseline'].removeprefix('suffix-decoding ')} "
            f"| {s['warm']:.2f}× ({s['cold']:.2f}×, {s['all']:.2f}×) | {row['ratio_warm']:.3f} |"
        )
    md += ["", f"Best over every workload: {name_of(settings[default])}."]
    with open(os.path.join(args.out_dir, "loo.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
