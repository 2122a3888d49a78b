"""infini-sidecar against tokengrams, the part of eval/bench_engine.py that `--tokengrams-python` runs.

Both engines read the same little-endian u16 token file (our `tokenized.0`; tokengrams' MemmapIndex reads
it as is). Per corpus: suffix-array build (wall and CPU seconds, table bytes per token), then count and
next-token distributions for prompts of 1, 2, 3, 5 and 8 tokens, each asked twice with only the second
pass timed. Time is CPU time per call: ours the thread's, around the library call and the answer's JSON
text; theirs the process's, around `count`/`count_next` and the conversion of its answer to a Python list.
"""
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from array import array

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PEER = os.path.join(ROOT, "tests", "peer", "tokengrams_engine.py")
LENGTHS = (1, 2, 3, 5, 8)
PER_LENGTH = 200
SEPARATOR = 0xFFFF
# The shift of ids between two copies of the big corpus: prime, so no copy maps onto another.
SHIFT = 7919

BIG_CORPUS = r"""
import sys, numpy as np
src, out, vocab, target = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
base = np.fromfile(src, dtype="<u2")
ids = base != 0xFFFF
with open(out, "wb") as f:
    written, k = 0, 0
    while written < target:
        copy = base.copy()
        copy[ids] = ((base[ids].astype(np.uint32) + k * %d) %% vocab).astype(np.uint16)
        copy.tofile(f)
        written += len(copy)
        k += 1
""" % SHIFT


def cpu_children():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cmd):
    """Wall and CPU seconds of a command, and its stdout."""
    wall, cpu = time.time(), cpu_children()
    out = subprocess.run(cmd, check=True, capture_output=True).stdout
    return time.time() - wall, cpu_children() - cpu, out


def prompts(tokens_path, seed):
    """PER_LENGTH prompts per length, at random places of the token file, never across a separator."""
    tokens = array("H")
    with open(tokens_path, "rb") as f:
        tokens.frombytes(f.read())
    rng = random.Random(seed)
    out = {}
    for n in LENGTHS:
        # The file's last n tokens: a prompt whose last match has no next token (eos to us).
        tail = tokens[len(tokens) - n:].tolist()
        picked = [] if SEPARATOR in tail else [tail]
        while len(picked) < PER_LENGTH:
            i = rng.randrange(0, len(tokens) - n)
            p = tokens[i:i + n].tolist()
            if SEPARATOR not in p:
                picked.append(p)
        out[n] = picked
    return out


def ask(cmd, queries):
    """Answers of `cmd`, each query asked twice and the first (warm-up) pass dropped."""
    warm = [dict(q, qid="warm-" + q["qid"]) for q in queries]
    data = "".join(json.dumps(q) + "\n" for q in warm + queries).encode()
    out = subprocess.run(cmd, input=data, check=True, capture_output=True).stdout
    answers = [json.loads(line) for line in out.decode().splitlines()]
    return {a["qid"]: a for a in answers if not a["qid"].startswith("warm-")}


def stats(xs):
    xs = sorted(xs)
    return {"median_ms": statistics.median(xs), "mean_ms": statistics.fmean(xs),
            "p99_ms": xs[min(len(xs) - 1, int(0.99 * len(xs)))]}


def compare(name, sidecar, tg_python, tokens, vocab, eos, work):
    """One corpus: builds both indexes of `tokens`, then times and checks every query."""
    ours_dir, their_table = os.path.join(work, name + "-ours"), os.path.join(work, name + "-tokengrams.idx")
    wall, cpu, report = timed([sidecar, "index", "build", "--from-tokens", tokens, "--token-width", "16",
                               "--eos-id", str(eos), "--vocab-size", str(vocab), "--memory-gib", "16", "--out", ours_dir, "--force", "--json"])
    report = json.loads(report)
    n_tokens = os.path.getsize(tokens) // 2
    table = os.path.getsize(os.path.join(ours_dir, "table.0")) if os.path.exists(os.path.join(ours_dir, "table.0")) else 0
    next_table = sum(os.path.getsize(os.path.join(ours_dir, f)) for f in os.listdir(ours_dir) if f.startswith("nexttok."))
    build = {"ours": {"seconds": wall, "cpu_seconds": cpu, "suffix_array_seconds": report["seconds_suffix_array"],
                      "next_token_table_seconds": report["seconds_next_token_table"],
                      "table_bytes_per_token": table / n_tokens, "next_token_table_bytes": next_table,
                      "shards": report["shards"]}}
    if os.path.exists(their_table):
        os.remove(their_table)
    wall, cpu, out = timed([tg_python, PEER, "build", "--tokens", tokens, "--table", their_table])
    theirs = json.loads(out.decode().strip().splitlines()[-1])  # it prints a progress line first
    build["tokengrams"] = {"seconds": wall, "cpu_seconds": cpu, "table_bytes_per_token": theirs["table_bytes"] / n_tokens}

    ps = prompts(tokens, seed=len(name))
    # A prompt that never occurs: what a call costs before any search (tokengrams' dense answer list).
    absent = [vocab - 1] * 4
    queries = [{"op": "ntd", "prompt": absent, "qid": f"floor-{k}"} for k in range(PER_LENGTH)]
    for n, group in ps.items():
        for k, p in enumerate(group):
            queries.append({"op": "ntd", "prompt": p, "qid": f"ntd-{n}-{k}"})
            queries.append({"op": "count", "ids": p, "qid": f"count-{n}-{k}"})
    ours = ask([sidecar, "query", "--index", ours_dir, "--timing", "--warm"], queries)
    theirs = ask([tg_python, PEER, "query", "--tokens", tokens, "--table", their_table, "--eos", str(eos), "--timing"], queries)
    floor = [f"floor-{k}" for k in range(PER_LENGTH)]
    assert ours[floor[0]]["prompt_cnt"] == 0, "the absent prompt occurs"
    result = {"tokens": n_tokens, "build": build, "by_length": {}, "disagreements": [],
              "ntd_of_an_absent_prompt": {"ours": stats([ours[q]["latency"] for q in floor]),
                                          "tokengrams": stats([theirs[q]["latency"] for q in floor])}}
    for n in LENGTHS:
        row = {}
        for op in ("ntd", "count"):
            qids = [f"{op}-{n}-{k}" for k in range(PER_LENGTH)]
            row[op] = {"ours": stats([ours[q]["latency"] for q in qids]),
                       "tokengrams": stats([theirs[q]["latency"] for q in qids])}
            for q in qids:
                a, b = ours[q], theirs[q]
                same = a["count"] == b["count"] if op == "count" else (
                    a["prompt_cnt"] == b["prompt_cnt"] and a["dist"] == b["dist"])
                if not same:
                    result["disagreements"].append(q)
        ntd_sizes = [len(ours[f"ntd-{n}-{k}"]["dist"]) for k in range(PER_LENGTH)]
        row["median_distinct_next_tokens"] = statistics.median(ntd_sizes)
        result["by_length"][n] = row
    return result


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main(args, sidecar):
    info = json.loads(subprocess.run([sidecar, "index", "info", "--json", "--index", args.index], check=True,
                                     capture_output=True).stdout)
    if info["token_width"] != 2 or info["shards"] != 1:
        sys.exit("the tokengrams comparison needs a one-shard u16 index (MemmapIndex reads one u16 file)")
    vocab, eos = info["vocab_size"], info["eos_token_id"]
    work = args.work or tempfile.mkdtemp(prefix="bench-tokengrams-")
    os.makedirs(work, exist_ok=True)
    default_tokens = os.path.join(args.index, "tokenized.0")
    big_tokens = os.path.join(work, "big.tokens")
    if not os.path.exists(big_tokens) or os.path.getsize(big_tokens) < 2 * args.big_tokens:
        subprocess.run([args.tokengrams_python, "-c", BIG_CORPUS, default_tokens, big_tokens, str(vocab),
                        str(args.big_tokens)], check=True)
    result = {"cpu": cpu_name(), "cpus": os.cpu_count(), "command": " ".join(sys.argv), "corpora": {}}
    for name, tokens in (("default", default_tokens), ("big", big_tokens)):
        result["corpora"][name] = compare(name, sidecar, args.tokengrams_python, tokens, vocab, eos, work)
        print_corpus(name, result["corpora"][name])
    out = os.path.join(os.path.dirname(args.out), "engine-tokengrams.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=2)


def print_corpus(name, r):
    b = r["build"]
    print(f"\n{name}: {r['tokens']:,} tokens; disagreements: {len(r['disagreements'])}")
    print(f"build: ours {b['ours']['seconds']:.1f} s wall ({b['ours']['suffix_array_seconds']:.1f} s suffix array, "
          f"{b['ours']['next_token_table_seconds']:.1f} s next-token table), {b['ours']['cpu_seconds']:.1f} s CPU, "
          f"{b['ours']['table_bytes_per_token']:.0f} B/token + {b['ours']['next_token_table_bytes'] / 2**20:.1f} MiB table; "
          f"tokengrams {b['tokengrams']['seconds']:.1f} s wall, {b['tokengrams']['cpu_seconds']:.1f} s CPU, "
          f"{b['tokengrams']['table_bytes_per_token']:.0f} B/token")
    f = r["ntd_of_an_absent_prompt"]
    print(f"ntd of a prompt that never occurs (the cost of a call and its answer): ours "
          f"{f['ours']['median_ms'] * 1e3:.1f} µs, tokengrams {f['tokengrams']['median_ms'] * 1e3:.1f} µs (median)")
    print("| prompt tokens | op | ours median | tokengrams median | ours / theirs (median) | ours mean | tokengrams mean | ours / theirs (mean) |")
    print("|---|---|---|---|---|---|---|---|")
    for n, row in r["by_length"].items():
        for op in ("ntd", "count"):
            o, t = row[op]["ours"], row[op]["tokengrams"]
            print(f"| {n} | {op} | {o['median_ms'] * 1e3:.1f} µs | {t['median_ms'] * 1e3:.1f} µs | "
                  f"{o['median_ms'] / t['median_ms']:.2f} | {o['mean_ms'] * 1e3:.1f} µs | {t['mean_ms'] * 1e3:.1f} µs | "
                  f"{o['mean_ms'] / t['mean_ms']:.2f} |")
