"""A greedy decoding loop that mixes its own model's next-token distribution with the sidecar's ∞-gram.

The sidecar keeps the sequence (a Session stream), so each step sends only the new token and the
client model's top-k log-probs, never the whole context. The "model" here is a bigram model of the
prompt, standing in for an inference server's logits: replace `client_top_k` with yours.

    python clients/python/examples/decode_loop.py --addr 127.0.0.1:50051 --prompt "The kernel" --steps 20

Prints one JSON object per step (what was sent, what was chosen) and the decoded text.
"""
import argparse
import json
import math
from collections import Counter, defaultdict

from infini_sidecar import Sidecar, top_k_logprobs

TOP_K = 8


class BigramModel:
    """Add-one bigram counts of the tokens seen so far, over the vocabulary."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.follows = defaultdict(Counter)

    def observe(self, tokens):
        for a, b in zip(tokens, tokens[1:]):
            self.follows[a][b] += 1

    def top_k(self, last):
        counts = self.follows[last]
        total = sum(counts.values()) + self.vocab_size
        top = counts.most_common(TOP_K)
        tokens = [t for t, _ in top]
        logprobs = [math.log((c + 1) / total) for _, c in top]
        rest = 1.0 - sum(math.exp(l) for l in logprobs)
        return tokens, logprobs, rest


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", default="127.0.0.1:50051")
    ap.add_argument("--token", default=None)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--fixed-lambda", type=float,
                    help="instead of the mixing file's default rule (adaptive: λ learnt from this session's tokens)")
    args = ap.parse_args()

    sidecar = Sidecar(args.addr, args.token)
    vocab = sidecar.info().vocab_size
    context = sidecar.tokenize(args.prompt)
    model = BigramModel(vocab)
    model.observe(context)

    session = sidecar.session()
    session.start(context)
    sequence = list(context)
    for step in range(args.steps):
        tokens, logprobs, rest = model.top_k(sequence[-1])
        mixed = session.mix(top_k_logprobs=top_k_logprobs(tokens, logprobs, rest), rule=args.fixed_lambda,
                            top_k=TOP_K)
        chosen = mixed.top[0].token
        print(json.dumps({"step": step, "length": len(sequence), "tokens": tokens,
                          "logprobs": logprobs, "rest_mass": rest, "chosen": chosen,
                          "lambda": getattr(mixed, "lambda"), "suffix_len": mixed.suffix_len}))
        state = session.append([chosen])
        assert state.length == len(sequence) + 1
        sequence.append(chosen)
        model.observe(sequence[-2:])
    session.close()
    print(json.dumps({"sequence": sequence}))


if __name__ == "__main__":
    main()
