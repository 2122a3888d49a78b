#!/usr/bin/env python3
"""A reproducible workload shaped like agentic and structured-output pipelines, from the real assets.

Requests recur, with variations, over the same few dozen mini-Pile test documents: extract as JSON,
summarise, answer about the document, rewrite its opening as a docstring; and multi-turn follow-ups
that quote an earlier request's answer (`{"answer_of": ID}` as an assistant message, filled in with
what the model generated for that request when the workload is replayed). One JSON object a line:

  {"id": "r007", "messages": [{"role": "user", "content": "..."}, ...],
   "max_new_tokens": 256, "namespace": "agent", "reference": "..."}   (reference optional)

`infini-sidecar eval workload` replays it in order. Usage:
  python3 scripts/make_workload.py --minipile ASSETS/minipile/test.jsonl --out eval/workloads/agentic.jsonl
"""

import argparse
import json
import random

EXTRACT = [
    'Extract from the document below a JSON object with the keys "title", "topic", "entities" '
    '(a list of names) and "summary" (one sentence). Answer with the JSON only.',
    'Return a JSON object describing the document below, with the keys "title", "topic", '
    '"entities" (a list of names) and "summary" (one sentence). Output JSON only.',
]
SUMMARISE = [
    "Summarise the document below in three sentences.",
    "Write a three-sentence summary of the document below.",
]
ANSWER = [
    "Read the document below and answer: what is its main subject, and who is it written for?",
    "What is the document below mainly about, and who would read it? Answer briefly.",
]
DOCSTRING = [
    "Rewrite the opening of the document below as the docstring of a Python function named "
    "`describe`. Answer with the function only.",
]
FOLLOW_UPS = [
    'Add a key "keywords" with five keywords and return the whole JSON again.',
    "Now give the same JSON with the summary shortened to ten words.",
]


def documents(path, count, rng):
    """`count` test documents of a workable length, their first 1,200 characters."""
    with open(path, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    usable = [t for t in texts if 800 <= len(t) <= 20000]
    rng.shuffle(usable)
    return [t[:1200].rsplit(" ", 1)[0] for t in usable[:count]]


def user(instruction, doc):
    return {"role": "user", "content": f"{instruction}\n\nDocument:\n{doc}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minipile", required=True, help="mini-Pile test.jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--documents", type=int, default=24)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--namespace", default="agent")
    ap.add_argument("--seed", type=int, default=17)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    docs = documents(args.minipile, args.documents, rng)
    requests = []
    extracted = []  # (request id, document) of JSON extractions, for follow-ups
    for n in range(args.requests):
        rid = f"r{n:03d}"
        doc = rng.choice(docs)
        kind = rng.choices(
            ["extract", "summarise", "answer", "docstring", "follow_up"],
            weights=[4, 2, 2, 1, 2 if extracted else 0],
        )[0]
        request = {"id": rid, "max_new_tokens": args.max_new_tokens, "namespace": args.namespace}
        if kind == "follow_up":
            earlier, doc = rng.choice(extracted)
            request["messages"] = [
                user(EXTRACT[0], doc),
                {"role": "assistant", "answer_of": earlier},
                {"role": "user", "content": rng.choice(FOLLOW_UPS)},
            ]
        else:
            instruction = rng.choice(
                {"extract": EXTRACT, "summarise": SUMMARISE, "answer": ANSWER, "docstring": DOCSTRING}[kind]
            )
            request["messages"] = [user(instruction, doc)]
            if kind == "docstring":
                # The caller knows the answer will quote the document: a predicted output.
                request["reference"] = doc
            if kind == "extract":
                extracted.append((rid, doc))
        request["kind"] = kind
        requests.append(request)
    with open(args.out, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"{len(requests)} requests over {len(docs)} documents -> {args.out}")


if __name__ == "__main__":
    main()
