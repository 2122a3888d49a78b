#!/usr/bin/env python3
"""Side-by-side engine benchmarks, same tokens, same queries, process CPU time per query, in one run:
infini-sidecar vs the reference engine (infini-gram 2.6.0), and vs tokengrams (0.3.3).

  python3 eval/bench_engine.py --index DIR --heldout TEST.jsonl --tokenizer MODEL.gguf \
      [--reference-python VENV/bin/python] [--tokengrams-python VENV/bin/python] [--out eval/results/engine.json]

Against tokengrams (`--tokengrams-python`, writes eval/results/engine-tokengrams.json): count and next-token
distributions by prompt length (1, 2, 3, 5, 8 tokens; prompts taken at random places of the indexed
documents, so they occur and frequent tokens come up as often as text has them), suffix-array build time
and table size, on two corpora: the index's own `tokenized.0`, and a corpus of `--big-tokens` tokens
(default 100 M) made of copies of it whose ids are shifted per copy (so copies do not repeat each other
and the suffix array is far larger than any cache). Answers are checked equal.

Queries come from held-out text (the mini-Pile test split, not in the index): n-grams for count and prob,
short prompts for ntd, long contexts for the ∞-gram queries, whole windows for dense scoring. The
reference runs through its Python API with prefetch disabled; its ntd keeps its default subsampling
(max_support=1000) while ours is exact. Dense scoring on the reference is one infgram_prob per token.
"""
import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REFERENCE = os.path.join(ROOT, "tests", "peer", "reference_engine.py")


def sidecar():
    return os.environ.get("INFINI_SIDECAR_BIN", os.path.join(ROOT, "target", "release", "infini-sidecar"))


def heldout_tokens(heldout, tokenizer, tmp):
    """Token ids of the held-out documents, through our own index of them."""
    idx = os.path.join(tmp, "heldout")
    subprocess.run([sidecar(), "index", "build", "--input", heldout, "--tokenizer", tokenizer, "--out", idx],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    info = json.loads(subprocess.run([sidecar(), "index", "info", "--json", "--index", idx], check=True, capture_output=True).stdout)
    qs = "".join(json.dumps({"op": "get_doc", "doc_ix": d}) + "\n" for d in range(info["documents"]))
    out = subprocess.run([sidecar(), "query", "--index", idx], input=qs.encode(), check=True, capture_output=True).stdout
    return [json.loads(l)["token_ids"] for l in out.decode().splitlines()], info


def make_queries(docs, seed=0, per_op=400, dense_windows=8, dense_len=1000):
    rng = random.Random(seed)
    def span(n):
        d = rng.choice([d for d in docs if len(d) > n + 1])
        i = rng.randrange(0, len(d) - n)
        return d[i:i + n]
    qs = []
    for k in range(per_op):
        n = rng.randint(1, 10)
        s = span(n + 1)
        qs.append({"op": "count", "ids": s[:n], "qid": f"count-{k}"})
        qs.append({"op": "prob", "prompt": s[:n], "cont": s[n], "qid": f"prob-{k}"})
        m = rng.randint(1, 5)
        qs.append({"op": "ntd", "prompt": span(m), "qid": f"ntd-{k}"})
        ctx = span(rng.randint(100, 500) + 1)
        qs.append({"op": "infgram_prob", "prompt": ctx[:-1], "cont": ctx[-1], "qid": f"infgram_prob-{k}"})
        qs.append({"op": "infgram_ntd", "prompt": span(rng.randint(100, 500)), "qid": f"infgram_ntd-{k}"})
    for k in range(dense_windows):
        qs.append({"op": "score", "ids": span(dense_len), "qid": f"score-{k}"})
    return qs


def run(cmd, queries):
    """Answers of `cmd`; every query is asked twice and the first (warm-up) pass is dropped, so neither
    engine is timed on page faults."""
    warm = [dict(q, qid="warm-" + q["qid"]) for q in queries]
    data = "".join(json.dumps(q) + "\n" for q in warm + queries).encode()
    out = subprocess.run(cmd, input=data, check=True, capture_output=True).stdout
    answers = [json.loads(l) for l in out.decode().splitlines()]
    return [a for a in answers if not a["qid"].startswith("warm-")]


def summarize(answers):
    by_op = {}
    for a in answers:
        op = a["qid"].rsplit("-", 1)[0]
        lat = a["latency"]
        if op == "score":
            lat = lat / len(a["prob"])  # ms per token
        by_op.setdefault(op, []).append(lat)
    out = {}
    for op, xs in by_op.items():
        xs = sorted(xs)
        out[op] = {"n": len(xs), "median_ms": statistics.median(xs), "mean_ms": statistics.fmean(xs),
                   "p99_ms": xs[min(len(xs) - 1, int(0.99 * len(xs)))]}
    return out


def time_build(cmd):
    start = time.time()
    before = resource_children()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.time() - start, resource_children() - before


def resource_children():
    import resource
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--index", required=True)
    p.add_argument("--heldout", required=True)
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--reference-python")
    p.add_argument("--tokengrams-python")
    p.add_argument("--big-tokens", type=int, default=100_000_000)
    p.add_argument("--work", help="folder for the tokengrams comparison's corpora and indexes (default: a temporary one)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "engine.json"))
    p.add_argument("--skip-build", action="store_true", help="skip the side-by-side suffix-array build")
    args = p.parse_args()
    if args.tokengrams_python:
        import bench_tokengrams
        bench_tokengrams.main(args, sidecar())
    if args.reference_python:
        against_reference(args)


def against_reference(args):
    info = json.loads(subprocess.run([sidecar(), "index", "info", "--json", "--index", args.index], check=True, capture_output=True).stdout)
    with tempfile.TemporaryDirectory() as tmp:
        docs, _ = heldout_tokens(args.heldout, args.tokenizer, tmp)
        queries = make_queries(docs)
        ours = run([sidecar(), "query", "--index", args.index, "--timing", "--warm"], queries)
        theirs = run([args.reference_python, REFERENCE, "query", "--index", args.index, "--timing",
                      "--eos", str(info["eos_token_id"]), "--vocab", str(info["vocab_size"]),
                      "--dtype", {1: "u8", 2: "u16", 4: "u32"}[info["token_width"]]], queries)
        agree = sum(1 for a, b in zip(ours, theirs) if a["qid"].startswith(("count", "prob", "infgram_prob"))
                    and all(a.get(k) == b.get(k) for k in ("count", "prompt_cnt", "cont_cnt", "suffix_len")))
        build = {}
        if not args.skip_build:
            # Suffix-array construction of the same tokens, both ways (tokenization is not compared).
            shards = info["shards"]
            for name, cmd_of in [
                ("ours", lambda d: [sidecar(), "index", "build", "--from-tokens", os.path.join(args.index, "tokenized.0"),
                                    "--token-width", str(8 * info["token_width"]), "--eos-id", str(info["eos_token_id"]),
                                    "--vocab-size", str(info["vocab_size"]), "--out", os.path.join(d, "idx")]),
                ("reference", lambda d: [args.reference_python, "-m", "infini_gram.indexing", "--data_dir", d,
                                         "--save_dir", os.path.join(d, "idx"), "--token_dtype",
                                         {1: "u8", 2: "u16", 4: "u32"}[info["token_width"]],
                                         "--cpus", str(os.cpu_count()), "--mem", "16", "--ulimit", "20000"]),
            ]:
                if shards != 1:
                    break
                d = tempfile.mkdtemp(dir=tmp)
                if name == "reference":
                    os.makedirs(os.path.join(d, "idx"))
                    for f in ("tokenized.0", "offset.0"):
                        shutil.copy(os.path.join(args.index, f), os.path.join(d, "idx", f))
                seconds, _ = time_build(cmd_of(d))
                build[name] = {"seconds": seconds}
                shutil.rmtree(d)
    tokens = info["tokens_with_separators"]
    result = {"index": {k: info[k] for k in ("documents", "tokens_with_separators", "token_width", "shards")},
              "machine": {"cpus": os.cpu_count()},
              "ours": summarize(ours), "reference": summarize(theirs), "build_suffix_array": build,
              "agreeing_count_prob_answers": agree,
              "command": " ".join(sys.argv)}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"index: {tokens} tokens; queries from held-out text; CPU time per query (dense: per token)\n")
    print("| query | ours median | ours p99 | reference median | reference p99 | median speed-up |")
    print("|---|---|---|---|---|---|")
    for op in ("count", "prob", "ntd", "infgram_prob", "infgram_ntd", "score"):
        o, r = result["ours"][op], result["reference"][op]
        print(f"| {op} | {o['median_ms']*1e3:.1f} µs | {o['p99_ms']*1e3:.1f} µs | {r['median_ms']*1e3:.1f} µs "
              f"| {r['p99_ms']*1e3:.1f} µs | {r['median_ms']/max(o['median_ms'],1e-9):.1f}× |")
    for name, b in build.items():
        print(f"suffix array build ({name}): {b['seconds']:.1f} s")


if __name__ == "__main__":
    main()
