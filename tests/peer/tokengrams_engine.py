#!/usr/bin/env python3
"""tokengrams (EleutherAI, 0.3.3), the other suffix-array engine, as a peer for our benchmarks.

  tokengrams_engine.py build --tokens tokenized.0 --table OUT.idx [--vocab N]
  tokengrams_engine.py query --tokens tokenized.0 --table OUT.idx --eos N [--vocab N] [--timing] < queries.jsonl

`build` writes tokengrams' own suffix table for a raw little-endian u16 token file (our `tokenized.0`
is one: separators are the token 0xFFFF) and prints its wall and CPU seconds as JSON. `query` reads the
same JSON lines as `infini-sidecar query` for the ops tokengrams has (count, and ntd through its
`count_next`) and answers in our shape. Its suffixes are tokens, not documents: a separator is token
0xFFFF to it, and the shard's last suffix has no next token. Our ntd counts both as eos, so the answer
moves them there, which makes the two directly comparable. With --timing each answer carries `latency`,
the process CPU time of the tokengrams call in ms, the conversion of its answer to a Python list
included (what a caller of it pays).
"""
import argparse
import json
import os
import sys
import time

from tokengrams import MemmapIndex

SEPARATOR = 0xFFFF


def ntd_answer(index, prompt, counts, eos, tokens_path):
    """`count_next`'s dense list in our shape: separators and the file's end count as eos."""
    dist = {t: c for t, c in enumerate(counts) if c}
    moved = dist.pop(SEPARATOR, 0) + (1 if ends_with(tokens_path, prompt) else 0)
    if moved:
        dist[eos] = dist.get(eos, 0) + moved
    return {"prompt_cnt": index.count(prompt), "dist": {str(t): c for t, c in sorted(dist.items())}}


def ends_with(tokens_path, prompt):
    """Whether the token file ends with `prompt` (its last suffix has no next token)."""
    size = os.path.getsize(tokens_path)
    if not prompt or 2 * len(prompt) > size:
        return False
    with open(tokens_path, "rb") as f:
        f.seek(size - 2 * len(prompt))
        tail = f.read()
    return [int.from_bytes(tail[i:i + 2], "little") for i in range(0, len(tail), 2)] == list(prompt)


def query(args):
    index = MemmapIndex(args.tokens, args.table, vocab=args.vocab)
    for line in sys.stdin:
        q = json.loads(line)
        start = time.process_time()
        if q["op"] == "count":
            out = {"count": index.count(q["ids"])}
            latency = time.process_time() - start
        elif q["op"] == "ntd":
            counts = index.count_next(q["prompt"])
            latency = time.process_time() - start
            out = ntd_answer(index, q["prompt"], counts, args.eos, args.tokens)
        else:
            out, latency = {"error": f"unsupported op {q['op']}"}, 0.0
        if args.timing:
            out["latency"] = latency * 1e3
        out["qid"] = q.get("qid")
        print(json.dumps(out))


def build(args):
    wall, cpu = time.time(), time.process_time()
    MemmapIndex.build(args.tokens, args.table, vocab=args.vocab, verbose=False)
    print(json.dumps({"seconds": time.time() - wall, "cpu_seconds": time.process_time() - cpu,
                      "table_bytes": os.path.getsize(args.table)}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("build", "query"):
        s = sub.add_parser(name)
        s.add_argument("--tokens", required=True)
        s.add_argument("--table", required=True)
        s.add_argument("--vocab", type=int, default=2 ** 16)
        if name == "query":
            s.add_argument("--eos", type=int, required=True)
            s.add_argument("--timing", action="store_true")
    args = p.parse_args()
    build(args) if args.cmd == "build" else query(args)


if __name__ == "__main__":
    main()
