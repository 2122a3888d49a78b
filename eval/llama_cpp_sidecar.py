"""llama.cpp with the sidecar beside it (llama-cpp-python, the same SmolLM2 GGUF as the sidecar's):

- speculative decoding: greedy continuations of mini-Pile test prompts, plain, with llama-cpp-python's
  own prompt-lookup drafter, and with `infini_sidecar.llama_cpp.SidecarDraftModel`; every output must
  equal plain decoding's; tokens/s and speed-ups per domain;
- mixing: `SidecarLogitsProcessor` in llama.cpp's sampler (greedy generations, its cost per token),
  and the perplexity of llama.cpp's own logits against their mixture with the ∞-gram on test text.

    python eval/llama_cpp_sidecar.py --addr 127.0.0.1:50051 --model SmolLM2.gguf \
        --input test.jsonl --out eval/results/llama-cpp/report.json

Needs a sidecar serving the index of the same tokenizer (eval/run_llama_cpp.sh starts one).
"""
import argparse
import json
import math
import platform
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

from infini_sidecar import Sidecar
from infini_sidecar.llama_cpp import SidecarDraftModel, SidecarLogitsProcessor


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "")
                keep = [f for f in ["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8"]
                        if f in flags.split()]
                return f"{line.split(':', 1)[1].strip()} ({' '.join(keep)})"
    except OSError:
        pass
    return platform.processor()


def prompts(sidecar, path, per_domain, prompt_tokens):
    """(domain, prompt ids) of the first documents of each domain long enough for a prompt."""
    by_domain = defaultdict(list)
    for line in open(path):
        doc = json.loads(line)
        domain = doc.get("meta", {}).get("pile_set_name", "all")
        if len(by_domain[domain]) >= per_domain:
            continue
        ids = sidecar.tokenize(doc["text"][:8 * prompt_tokens])
        if len(ids) >= prompt_tokens:
            by_domain[domain].append(ids[:prompt_tokens])
    return [(d, p) for d in sorted(by_domain) for p in by_domain[d]]


def generate(llm, prompt, max_tokens):
    started = time.perf_counter()
    out = llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, top_k=1)
    seconds = time.perf_counter() - started
    tokens = llm.tokenize(out["choices"][0]["text"].encode(), add_bos=False, special=True)
    return out["choices"][0]["text"], out["usage"]["completion_tokens"], seconds, tokens


def speculative(args, sidecar, cases):
    drafters = {
        "plain": lambda: None,
        "llama_prompt_lookup": lambda: LlamaPromptLookupDecoding(num_pred_tokens=args.draft_tokens),
        "sidecar": lambda: SidecarDraftModel(sidecar, max_tokens=args.draft_tokens,
                                             min_path_prob=args.min_path_prob),
    }
    runs = {}
    for name, make in drafters.items():
        drafter = make()
        llm = Llama(args.model, n_ctx=2048, n_threads=args.threads, draft_model=drafter, verbose=False,
                    logits_all=drafter is not None)
        generate(llm, cases[0][1], 8)  # warm-up
        runs[name] = []
        for domain, prompt in cases:
            llm.reset()
            text, n, seconds, _ = generate(llm, prompt, args.max_new_tokens)
            runs[name].append({"domain": domain, "text": text, "tokens": n, "seconds": seconds})
        if isinstance(drafter, SidecarDraftModel):
            runs["sidecar_drafter"] = {"calls": drafter.calls, "drafted": drafter.drafted,
                                       "us_per_call": 1e6 * drafter.seconds / max(drafter.calls, 1)}
            drafter.close()
        del llm
    plain = runs["plain"]
    table = {}
    for name in ["plain", "llama_prompt_lookup", "sidecar"]:
        per_domain = defaultdict(lambda: [0, 0.0])
        identical = 0
        for run, base in zip(runs[name], plain):
            identical += run["text"] == base["text"]
            per_domain[run["domain"]][0] += run["tokens"]
            per_domain[run["domain"]][1] += run["seconds"]
            per_domain["all"][0] += run["tokens"]
            per_domain["all"][1] += run["seconds"]
        table[name] = {"identical_to_plain": f"{identical}/{len(plain)}",
                       "tokens_per_second": {d: n / s for d, (n, s) in per_domain.items()}}
    for name in ["llama_prompt_lookup", "sidecar"]:
        table[name]["speed_up"] = {d: v / table["plain"]["tokens_per_second"][d]
                                   for d, v in table[name]["tokens_per_second"].items()}
    table["sidecar_drafter"] = runs["sidecar_drafter"]
    return table


def mixing(args, sidecar, cases):
    """Greedy generations through the processor, and the perplexity of llama.cpp's logits mixed."""
    llm = Llama(args.model, n_ctx=2048, n_threads=args.threads, verbose=False, logits_all=True)
    processor = SidecarLogitsProcessor(sidecar)
    samples = []
    for domain, prompt in cases[:: max(1, len(cases) // 4)][:4]:
        llm.reset()
        plain = llm.create_completion(prompt, max_tokens=32, temperature=0.0)["choices"][0]["text"]
        llm.reset()
        mixed = llm.create_completion(prompt, max_tokens=32, temperature=0.0,
                                      logits_processor=[processor])["choices"][0]["text"]
        samples.append({"domain": domain, "prompt": sidecar.detokenize(prompt[-24:]), "plain": plain,
                        "mixed": mixed})
    generation_us = 1e6 * processor.seconds / max(processor.calls, 1)
    processor.close()
    # Perplexity: each document's first tokens, run once with every position's logits.
    nll = defaultdict(lambda: [0.0, 0.0, 0])
    # Scoring is never guarded (as in `eval ppl`): the copy guard is for decoding.
    scorer = SidecarLogitsProcessor(sidecar, return_k=1000, max_match=2**31)
    for domain, ids in cases:
        ids = ids[: args.ppl_tokens]
        llm.reset()
        llm.eval(ids)
        scores = np.array(llm.scores[: len(ids)])
        for i in range(len(ids) - 1):
            logits = scores[i].astype(np.float64)
            neural = logits - logits.max()
            neural -= np.log(np.exp(neural).sum())
            mixed = scorer(ids[: i + 1], scores[i])
            for key in [domain, "all"]:
                nll[key][0] -= neural[ids[i + 1]]
                nll[key][1] -= float(mixed[ids[i + 1]])
                nll[key][2] += 1
    scorer_us = 1e6 * scorer.seconds / max(scorer.calls, 1)
    scorer.close()
    ppl = {d: {"tokens": n, "llama_cpp": math.exp(a / n), "mixed": math.exp(b / n),
               "change_pct": 100 * (1 - math.exp(b / n) / math.exp(a / n))}
           for d, (a, b, n) in nll.items()}
    return {"generations": samples, "processor_us_per_token": generation_us,
            "scoring_us_per_token": scorer_us, "perplexity": ppl}


def row_costs(args):
    """ms of one llama.cpp pass of 1, 2, 4 and 9 rows after a 128-token prompt (median of 8), with and
    without every row's logits: what verifying a draft costs against one decoding step."""
    costs = {}
    prompt = list(range(1000, 1200))
    for logits_all in [False, True]:
        llm = Llama(args.model, n_ctx=1024, n_threads=args.threads, logits_all=logits_all, verbose=False)
        for rows in [1, 2, 4, 9]:
            times = []
            for _ in range(8):
                llm.reset()
                llm.eval(prompt[:128])
                started = time.perf_counter()
                llm.eval(prompt[128:128 + rows])
                times.append(time.perf_counter() - started)
            costs[f"rows_{rows}{'_all_logits' if logits_all else ''}_ms"] = 1e3 * sorted(times)[4]
        del llm
    return costs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--addr", default="127.0.0.1:50051")
    ap.add_argument("--model", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--per-domain", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--draft-tokens", type=int, default=8)
    ap.add_argument("--min-path-prob", type=float, default=None,
                    help="the sidecar drafter's bar for drafting a node (default: the sidecar's, 0.2)")
    ap.add_argument("--ppl-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-mixing", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sidecar = Sidecar(args.addr)
    cases = prompts(sidecar, args.input, args.per_domain, args.prompt_tokens)
    report = {"cpu": cpu_name(), "model": Path(args.model).name, "prompts": len(cases),
              "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens,
              "threads": args.threads, "min_path_prob": args.min_path_prob, "pass_costs": row_costs(args),
              "speculative": speculative(args, sidecar, cases)}
    if not args.skip_mixing:
        report["mixing"] = mixing(args, sidecar, cases)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "mixing"}, indent=2))
    if "mixing" in report:
        print(json.dumps({k: v for k, v in report["mixing"].items() if k != "generations"}, indent=2))


if __name__ == "__main__":
    main()
