#!/usr/bin/env python3
"""Model speed side by side: ours, candle-transformers' forward (both from `cargo bench --bench model`)
and llama.cpp (llama-cpp-python, built from source here) on the same GGUF files and the same 1024 real
tokens, with 1 and 2 threads. Writes eval/results/model.json and prints a Markdown table.

    python3 eval/bench_model.py --llama-python PATH/TO/venv/bin/python

llama-cpp-python must be built without AMX: a native build enables ggml's AMX kernels, which crash
(SIGSEGV) where the kernel does not grant AMX tile state to the process, as in our sandbox:

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
      -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON" \
      VENV/bin/pip install --no-binary llama-cpp-python llama-cpp-python==0.3.36

Measures: tokens per second scoring one 1024-token window (all-position logits), and milliseconds per
token of single-token decode with the cache after a 32-token prompt.
"""
import argparse
import json
import os
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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", help="a Python with llama-cpp-python installed")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=f"{ROOT}/eval/results/model.json")
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "--bin", "infini-sidecar"], cwd=ROOT, check=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, tokenizer) in MODELS.items():
            tokens = os.path.join(tmp, "tokens.json")
            real_tokens(path, tokenizer, tokens)
            for threads in args.threads.split(","):
                env = dict(os.environ, CANDLE_NUM_THREADS=threads, RAYON_NUM_THREADS=threads)
                out = subprocess.check_output(["cargo", "bench", "-q", "--bench", "model", "--", path, tokens],
                                              cwd=ROOT, env=env, text=True)
                for line in out.splitlines():
                    if line.startswith("{"):
                        r = json.loads(line)
                        rows.append({"model": name, "threads": int(threads), "runtime": r["runtime"],
                                     "measure": r["measure"], "value": r["value"]})
                if args.llama_python:
                    run = subprocess.run([args.llama_python, "-c", LLAMA_CPP, path, tokens, threads],
                                         capture_output=True, text=True)
                    if run.returncode != 0:
                        print(f"[bench] llama.cpp failed ({run.returncode}): {run.stderr[-500:]}", file=sys.stderr)
                    for line in run.stdout.splitlines():
                        r = json.loads(line)
                        rows.append({"model": name, "threads": int(threads), "runtime": "llama.cpp",
                                     "measure": r["measure"], "value": r["value"]})
                print(f"[bench] {name}, {threads} threads done", file=sys.stderr)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    meta = {"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(": "),
            "date": time.strftime("%Y-%m-%d"), "window": WINDOW, "decode_steps": DECODE_STEPS}
    json.dump({"meta": meta, "rows": rows}, open(args.out, "w"), indent=1)
    runtimes = ["ours", "ours (quantized)", "candle-transformers", "llama.cpp"]
    print("| model | threads | measure | " + " | ".join(runtimes) + " |")
    print("|---|---|---|" + "---|" * len(runtimes))
    keys = sorted({(r["model"], r["threads"], r["measure"]) for r in rows})
    for model, threads, measure in keys:
        val = {r["runtime"]: r["value"] for r in rows
               if (r["model"], r["threads"], r["measure"]) == (model, threads, measure)}
        cell = lambda k: f"{val[k]:.1f}" if k in val else "–"
        print(f"| {model} | {threads} | {measure} | " + " | ".join(cell(k) for k in runtimes) + " |")


if __name__ == "__main__":
    main()
