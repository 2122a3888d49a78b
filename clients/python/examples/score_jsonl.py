"""Scores a JSON-lines file ({"text": ..., "domain": ...} per line) with the sidecar's model and index,
the way an evaluation harness would: neural and mixed log-likelihood per document, then the totals.

    python clients/python/examples/score_jsonl.py --addr 127.0.0.1:50051 --input docs.jsonl [--gate]

Prints one JSON object per document and one for the totals.
"""
import argparse
import json

from infini_sidecar import Sidecar


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", default="127.0.0.1:50051")
    ap.add_argument("--token", default=None)
    ap.add_argument("--input", required=True)
    rule = ap.add_mutually_exclusive_group()
    rule.add_argument("--fixed-lambda", type=float)
    rule.add_argument("--gate", action="store_true")
    args = ap.parse_args()

    sidecar = Sidecar(args.addr, args.token)
    documents = []
    with open(args.input) as f:
        for line in f:
            if line.strip():
                doc = json.loads(line)
                documents.append((sidecar.tokenize(doc["text"]), doc.get("domain", "")))
    rule = args.fixed_lambda if args.fixed_lambda is not None else "gate" if args.gate else "split"
    for item in sidecar.score(documents, rule=rule):
        if item.HasField("document"):
            d = item.document
            print(json.dumps({"document": d.document, "tokens": d.tokens,
                              "neural_nll": d.neural_nll, "mixed_nll": d.mixed_nll}))
        else:
            t = item.totals
            print(json.dumps({"documents": t.documents, "tokens": t.tokens,
                              "neural_perplexity": t.neural_perplexity,
                              "mixed_perplexity": t.mixed_perplexity}))


if __name__ == "__main__":
    main()
