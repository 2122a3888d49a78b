#!/usr/bin/env python3
"""The reference engine (infini-gram 2.6.0) as an oracle for our tests and benchmarks.

  reference_engine.py query --index DIR --eos N --vocab N --dtype u16 [--timing] < queries.jsonl > answers.jsonl

Reads the same JSON lines as `infini-sidecar query` (ops count, prob, ntd, infgram_prob, infgram_ntd,
find, search_docs with `ids` or a one-clause `cnf`: `cnt` and `approx` only) and answers in the same shape: `dist` maps token id to count. With --timing each answer carries
`latency`, the process CPU time of the engine call in ms (prefetch disabled: the reference's fastest
mode when the index is in RAM).
"""
import argparse
import json
import sys
import time

from infini_gram.engine import InfiniGramEngine


def answer(engine, q, max_support):
    op = q["op"]
    if op == "count":
        return engine.count(input_ids=q["ids"])
    if op == "prob":
        return engine.prob(prompt_ids=q["prompt"], cont_id=q["cont"])
    if op in ("ntd", "infgram_ntd"):
        fn = engine.ntd if op == "ntd" else engine.infgram_ntd
        r = fn(prompt_ids=q["prompt"], max_support=q.get("max_support", max_support))
        if "error" not in r:
            r["dist"] = {str(t): v["cont_cnt"] for t, v in r.pop("result_by_token_id").items()}
        return r
    if op == "infgram_prob":
        return engine.infgram_prob(prompt_ids=q["prompt"], cont_id=q["cont"])
    if op == "find":
        return engine.find(input_ids=q["ids"])
    if op == "search_docs":
        # Documents are sampled at random by the reference: only the counts are comparable.
        if "cnf" in q:
            r = engine.search_docs_cnf(cnf=q["cnf"], maxnum=1)
        else:
            r = engine.search_docs(input_ids=q["ids"], maxnum=1)
        return r if "error" in r else {"cnt": r["cnt"], "approx": r["approx"]}
    if op == "score":
        # The reference has no dense op: one infgram_prob per position, as the paper's evaluation does.
        ids = q["ids"]
        rs = [engine.infgram_prob(prompt_ids=ids[:i], cont_id=ids[i]) for i in range(len(ids))]
        return {"prob": [r["prob"] for r in rs], "suffix_len": [r["suffix_len"] for r in rs]}
    return {"error": f"unsupported op {op}"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["query"])
    p.add_argument("--index", required=True)
    p.add_argument("--eos", type=int, required=True)
    p.add_argument("--vocab", type=int, required=True)
    p.add_argument("--dtype", default="u16", choices=["u8", "u16", "u32"])
    p.add_argument("--max-support", type=int, default=1000)
    p.add_argument("--timing", action="store_true")
    args = p.parse_args()
    engine = InfiniGramEngine(index_dir=args.index, eos_token_id=args.eos, vocab_size=args.vocab,
                              token_dtype=args.dtype, ds_prefetch_depth=0, sa_prefetch_depth=0,
                              od_prefetch_depth=0, max_support=args.max_support)
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        q = json.loads(line)
        start = time.process_time()
        r = answer(engine, q, args.max_support)
        elapsed = time.process_time() - start
        r = dict(r)
        for k, v in q.items():
            if k not in ("op", "ids", "prompt", "cont", "max_support", "cnf"):
                r[k] = v
        if args.timing:
            r["latency"] = elapsed * 1e3
        out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
