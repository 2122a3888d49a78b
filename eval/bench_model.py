#!/usr/bin/env python3
"""Model speed side by side, flavour by flavour: ours under each kernel flavour this CPU runs
(`INFINI_SIDECAR_CPU`) beside llama.cpp (llama-cpp-python, built from source here) built for the same
feature level, on the same GGUF files and the same 1024 real tokens, with 1 and 2 threads. Writes
eval/results/model-flavours.json and prints one Markdown table per flavour.

    source scripts/env.sh
    python3 eval/bench_model.py --llama-native "$(ensure_llama_cpp native)" --llama-avx2 "$(ensure_llama_cpp avx2)"

`ensure_llama_cpp` (scripts/env.sh) builds llama-cpp-python once per level and caches it outside the
clone: `native` (every feature /proc/cpuinfo lists, spelled out with GGML_NATIVE off; AMX off:
ggml's AMX kernels crash where the kernel grants no tile state) and `avx2` (AVX2, FMA and F16C only,
the AVX-512 and VNNI options off); each build is checked with a decode before it is kept.

Measures: tokens per second scoring one 1024-token window (all-position logits), milliseconds per
token of single-token decode with the cache after a 32-token prompt, and one pass of 1 and 8 rows
after that decode, rolled back (draft verification).

On a VM whose speed drifts, `--rounds N` runs each side N times in turns and reports each figure's
median; `--models` and `--levels` narrow a run (e.g. `--models SmolLM2 --levels native --rounds 7`).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.environ.get("INFINI_SIDECAR_ASSETS", os.path.expanduser("~/.cache/infini-sidecar/assets"))
MODELS = {
    "SmolLM2-135M Q4_1": (f"{ASSETS}/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", None),
    "Gemma-3-270M Q4_K_M": (f"{ASSETS}/gemma3/gemma-3-270m-q4_k_m.gguf", f"{ASSETS}/gemma3/tokenizer.json"),
}
WINDOW, DECODE_STEPS = 1024, 64

LLAMA_CPP = r"""
import json, sys, time
import llama_cpp
path, tokens_file, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = json.load(open(tokens_file))[:1024]
llm = llama_cpp.Llama(model_path=path, n_ctx=2048, n_batch=1024, n_ubatch=1024, n_threads=threads,
                      n_threads_batch=threads, logits_all=True, verbose=False)
times = []
for _ in range(3):
    llm.reset()
    t = time.perf_counter(); llm.eval(ids); times.append(time.perf_counter() - t)
times.sort()
print(json.dumps({"measure": "window_tokens_per_s", "value": 1024 / times[1]}))
llm.reset(); llm.eval(ids[:32])
t = time.perf_counter()
for i in ids[32:96]:
    llm.eval([i])
print(json.dumps({"measure": "decode_ms_per_token", "value": (time.perf_counter() - t) * 1e3 / 64}))
at = llm.n_tokens
for rows in (1, 8):
    times = []
    for _ in range(3):
        llm.n_tokens = at  # eval drops the cache past n_tokens
        t = time.perf_counter(); llm.eval(ids[at:at + rows]); times.append(time.perf_counter() - t)
    times.sort()
    print(json.dumps({"measure": f"pass_ms_{rows}_rows", "value": times[1] * 1e3}))
"""


def real_tokens(model_path, tokenizer, out):
    """The first 1024 tokens of the mini-Pile test split (BOS first for models that want one)."""
    text = ""
    with open(f"{ASSETS}/minipile/test.jsonl") as f:
        for line in f:
            text += json.loads(line)["text"]
            if len(text) > 20000:
                break
    binary = os.path.join(os.environ.get("CARGO_TARGET_DIR", f"{ROOT}/target"), "release", "infini-sidecar")
    ids = json.loads(subprocess.check_output([binary, "tokenize", "--tokenizer", tokenizer or model_path,
                                              "--text", text]))
    if tokenizer:  # Gemma: <bos>
        ids = [2] + ids
    json.dump(ids[:WINDOW], open(out, "w"))


# Our flavours, each beside the llama.cpp build of its feature level (none for AVX-VNNI alone, nor for
# the portable one). A flavour this CPU lacks is skipped.
LEVELS = [("native", "native"), ("avxvnni", None), ("avx2", "avx2"), ("portable", None)]
MEASURES = ["decode_ms_per_token", "pass_ms_1_rows", "pass_ms_8_rows", "window_tokens_per_s"]


def cpu_line():
    info = open("/proc/cpuinfo").read()
    name = info.split("model name")[1].split("\n")[0].strip(": \t")
    flags = set(info.split("flags")[1].split("\n")[0].strip(": \t").split())
    relevant = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "amx_int8"]
    return f"{name} ({' '.join(f for f in relevant if f in flags)})"


def bench_side(rows, cell, runtime, flavour, command, **how):
    """One run of one side (`runtime`: ours or llama.cpp), its JSON lines kept as rows under `cell`
    (model, threads, level, round); False if it failed (for ours: a flavour this CPU lacks).
    `flavour` names the kernels, or None to take the `kernel_flavour` each line reports."""
    run = subprocess.run(command, text=True, capture_output=True, **how)
    if run.returncode != 0:
        print(f"[bench] {runtime} under {cell['level']} failed ({run.returncode}): {run.stderr.strip()[-500:]}",
              file=sys.stderr)
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            rows.append(dict(cell, runtime=runtime, flavour=flavour or r["kernel_flavour"],
                             measure=r["measure"], value=r["value"]))
    return run.returncode == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-native", help="a Python with llama-cpp-python built natively (AMX off)")
    ap.add_argument("--llama-avx2", help="a Python with llama-cpp-python built for AVX2 only")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", help="only the models whose names contain one of these (comma-separated)")
    ap.add_argument("--levels", help="only these flavours (comma-separated: native, avxvnni, avx2, portable)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of each side, taken in turns; the tables give each figure's median")
    ap.add_argument("--out", default=f"{ROOT}/eval/results/model-flavours.json")
    args = ap.parse_args()
    llama = {"native": args.llama_native, "avx2": args.llama_avx2}
    subprocess.run(["cargo", "build", "--release", "--bin", "infini-sidecar"], cwd=ROOT, check=True)
    rows = []
    models = {name: files for name, files in MODELS.items()
              if not args.models or any(m.lower() in name.lower() for m in args.models.split(","))}
    levels = [lv for lv in LEVELS if not args.levels or lv[0] in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, tokenizer) in models.items():
            tokens = os.path.join(tmp, "tokens.json")
            real_tokens(path, tokenizer, tokens)
            for threads in args.threads.split(","):
                for level, llama_level in levels:
                    env = dict(os.environ, CANDLE_NUM_THREADS=threads, RAYON_NUM_THREADS=threads,
                               INFINI_SIDECAR_CPU=level)
                    ours = ["cargo", "bench", "-q", "--bench", "model", "--", path, tokens, "--ours-only"]
                    python = llama.get(llama_level) if llama_level else None
                    # Ours and llama.cpp take turns, round after round, so a drift of this VM's
                    # speed (10-20% on one-thread decode) falls on both alike.
                    for round_ in range(args.rounds):
                        cell = {"model": name, "threads": int(threads), "level": level, "round": round_}
                        if not bench_side(rows, cell, "ours", None, ours, cwd=ROOT, env=env):
                            break
                        if python:
                            bench_side(rows, cell, "llama.cpp", f"llama.cpp {llama_level}",
                                       [python, "-c", LLAMA_CPP, path, tokens, threads])
                    print(f"[bench] {name}, {threads} threads, {level} done", file=sys.stderr)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    meta = {"cpu": cpu_line(), "date": time.strftime("%Y-%m-%d"), "window": WINDOW,
            "decode_steps": DECODE_STEPS, "rounds": args.rounds}
    json.dump({"meta": meta, "rows": rows}, open(args.out, "w"), indent=1)
    print(f"CPU: {meta['cpu']}\n")
    for level, _ in LEVELS:
        flavours = {r["flavour"] for r in rows if r["level"] == level and r["runtime"] == "ours"}
        if not flavours:
            continue
        print(f"### {level}: ours ({', '.join(sorted(flavours))}) | llama.cpp {level}\n")
        print("| model | threads | " + " | ".join(f"{m} ours | llama.cpp" for m in MEASURES) + " | 8 rows / 1 ours | llama.cpp |")
        print("|---|---|" + "---|---|" * (len(MEASURES) + 1))
        for model in models:
            for threads in sorted({r["threads"] for r in rows}):
                runs = {}
                for r in rows:
                    if (r["model"], r["threads"], r["level"]) == (model, threads, level):
                        runs.setdefault((r["runtime"], r["measure"]), []).append(r["value"])
                val = {k: statistics.median(v) for k, v in runs.items()}
                cell = lambda k: f"{val[k]:.1f}" if k in val else "–"
                ratio = lambda rt: (f"{val[(rt, 'pass_ms_8_rows')] / val[(rt, 'pass_ms_1_rows')]:.2f}"
                                    if (rt, "pass_ms_8_rows") in val else "–")
                print(f"| {model} | {threads} | " + " | ".join(f"{cell(('ours', m))} | {cell(('llama.cpp', m))}"
                                                         for m in MEASURES)
                      + f" | {ratio('ours')} | {ratio('llama.cpp')} |")
        print()


if __name__ == "__main__":
    main()
