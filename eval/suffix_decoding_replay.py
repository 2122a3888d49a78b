#!/usr/bin/env python3
"""Replays a workload's greedy outputs through SuffixDecoding (arctic-inference's suffix tree), the
peer our live drafter is measured against, with the cost model of `eval workload`'s simulation:
a verify step costs 1 + c x rows drafted (c: --row-cost, default 0.2) and emits the accepted
tokens + 1.

Input: replay.json from `infini-sidecar eval workload --out-dir DIR` ([[prompt ids, output ids], ...]
in request order). Output (stdout): JSON, one row per configuration and part (all, cold = first fifth,
warm = last fifth) with speed-up, accepted per step and µs per drafted token of `speculate` alone and
of all the drafter's work (`start_request`, `speculate`, `add_active_response`, `stop_request`), as
`eval workload` times ours (taking in the prompt, drafting, appending). The context each
`speculate` is given is built outside the timer: SuffixDecoding's own integration hands it a view of
an array it already holds.

Needs the `arctic_inference.suffix_decoding` module (scripts/env.sh: ensure_suffix_decoding builds it
from the registry's arctic-inference 0.3.0 source package).
"""

import argparse
import json
import time

from arctic_inference.suffix_decoding import SuffixDecodingCache


def replay(requests, use_global, tree, max_spec, factor, min_prob, row_cost, replicas=1, depth=64):
    """Each request on one of `replicas` engines in turn, each engine with a cache of its own (its
    global tree holds what that engine generated), as vLLM's `suffix` runs over replicas."""
    caches = [SuffixDecodingCache(max_tree_depth=depth, max_cached_requests=-1 if use_global else 0)
              for _ in range(replicas)]
    rows = []
    for rid, (prompt, truth) in enumerate(requests):
        cache = caches[rid % replicas]
        prompt = list(prompt)
        started = time.perf_counter()
        cache.start_request(rid, prompt)
        all_s = time.perf_counter() - started
        out, cost, steps, accepted_total, drafted, spec_s = [], 0.0, 0, 0, 0, 0.0
        while len(out) < len(truth):
            room = min(max_spec, len(truth) - len(out) - 1)
            draft_ids, parents = [], []
            if room > 0:
                context = prompt + out
                started = time.perf_counter()
                d = cache.speculate(
                    rid,
                    context,
                    max_spec_tokens=room,
                    max_spec_factor=factor,
                    min_token_prob=min_prob,
                    use_tree_spec=tree,
                )
                spec_s += time.perf_counter() - started
                draft_ids, parents = list(d.token_ids), list(d.parents)
            accepted, node = 0, -1
            for tok in truth[len(out):]:
                nxt = next(
                    (i for i, p in enumerate(parents) if p == node and draft_ids[i] == tok), None
                )
                if nxt is None:
                    break
                accepted += 1
                node = nxt
            emit = min(accepted + 1, len(truth) - len(out))
            new = list(truth[len(out):len(out) + emit])
            cost += 1 + row_cost * len(draft_ids)
            steps += 1
            accepted_total += accepted
            drafted += len(draft_ids)
            out += new
            # The request's own tree learns its response; with the global cache, that tree does too.
            started = time.perf_counter()
            cache.add_active_response(rid, new)
            all_s += time.perf_counter() - started
        started = time.perf_counter()
        cache.stop_request(rid)
        all_s += time.perf_counter() - started + spec_s
        rows.append((len(truth), cost, steps, accepted_total, drafted, spec_s, all_s))
    return rows


def summarize(name, rows):
    n = len(rows)
    fifth = -(-n // 5)
    out = []
    for part, sel in (("all", rows), ("cold", rows[:fifth]), ("warm", rows[n - fifth:])):
        tokens = sum(r[0] for r in sel)
        cost = sum(r[1] for r in sel)
        steps = sum(r[2] for r in sel)
        accepted = sum(r[3] for r in sel)
        drafted = sum(r[4] for r in sel)
        spec_s = sum(r[5] for r in sel)
        all_s = sum(r[6] for r in sel)
        out.append(
            {
                "configuration": name,
                "part": part,
                "tokens": tokens,
                "speedup": tokens / cost,
                "accepted_per_step": accepted / max(steps, 1),
                "draft_calls_us_per_drafted_token": spec_s * 1e6 / max(drafted, 1),
                "all_work_us_per_drafted_token": all_s * 1e6 / max(drafted, 1),
            }
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("replay", help="replay.json of eval workload")
    ap.add_argument("--max-spec", type=int, nargs="+", default=[15, 32])
    ap.add_argument("--row-cost", type=float, default=0.2, help="a drafted row's share of a step")
    ap.add_argument("--replicas", type=int, default=1,
                    help="engines serving the requests in turn, each with its own cache")
    ap.add_argument("--tree-depth", type=int, default=64,
                    help="the trees' depth, which bounds a match plus its draft (vLLM's `suffix`: 24)")
    args = ap.parse_args()
    if args.replicas < 1:
        ap.error("--replicas: at least 1")
    with open(args.replay) as f:
        requests = json.load(f)
    results = []
    for use_global in (False, True):
        for tree in (False, True):
            for max_spec in args.max_spec:
                name = (
                    f"suffix-decoding {'global+prompt' if use_global else 'prompt only'}, "
                    f"{'tree' if tree else 'chain'}, max_spec {max_spec}"
                    + (f", {args.replicas} replicas" if args.replicas > 1 else "")
                    + (f", tree depth {args.tree_depth}" if args.tree_depth != 64 else "")
                )
                rows = replay(requests, use_global, tree, max_spec, 1.0, 0.1, args.row_cost,
                              args.replicas, args.tree_depth)
                results += summarize(name, rows)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
