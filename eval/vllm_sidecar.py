"""vLLM with the sidecar beside it (`infini_sidecar.vllm`), against vLLM's own drafters on the same
engine, the same machine and the same workload.

    # one method over a workload of `eval workload` (JSON lines: id, messages or prompt,
    # max_new_tokens; an assistant message may be {"answer_of": ID}), at a concurrency
    python eval/vllm_sidecar.py run --model DIR --workload eval/workloads/agentic.jsonl \
        --method plain|ngram|suffix|sidecar [--concurrency 8] [--replicas 2] --out RUN.json
    # the table: every run beside the plain run of the same concurrency and replicas
    python eval/vllm_sidecar.py table RUN.json ... > TABLE.md
    # the CI check (tests/integration/vllm.rs): the proposer's and the mixer's outputs
    python eval/vllm_sidecar.py check --model DIR
    # a run's outputs as the replay.json of `eval workload --replay` and suffix_decoding_replay.py
    python eval/vllm_sidecar.py replay RUN.json --model DIR --out replay.json
    # the proposer over those outputs without running vLLM, against a sidecar: steps and drafts per request
    python eval/vllm_sidecar.py drive replay.json --addr ADDR --k 16 [--replicas 2] --out DRIVE.json
    # what a drafted token costs vLLM, as a share of a decode step (runs at concurrency 1)
    python eval/vllm_sidecar.py costs RUN.json ...

`--replicas 2` runs two engines (two vLLM processes) and sends the requests to them in turn, one at
a time: with `suffix` each has its own tree, with the sidecar they share one live index. Each run
records per request its tokens and seconds, and for the whole run, the cold (first fifth) and warm
(last fifth) parts: tokens/s, drafted and accepted tokens and verify steps (vLLM's per-request
spec-decode counters), the CPU seconds of this process, of vLLM's engine processes and (with
--sidecar-pid) of the sidecar, and the sidecar's time per engine step (the proposer's own
counters). Needs a sidecar on --addr serving an index of the model's tokenizer (eval/run_vllm.sh
starts one) and vLLM (scripts/env.sh: ensure_vllm, ensure_vllm_model).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import tempfile
import sys
import time
from pathlib import Path


def cpu_name() -> str:
    try:
        model = next(l for l in open("/proc/cpuinfo") if l.startswith("model name"))
        flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "").split()
        keep = [f for f in ["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8"]
                if f in flags]
        return f"{model.split(':', 1)[1].strip()} ({' '.join(keep)}), {os.cpu_count()} cores"
    except (OSError, StopIteration):
        return platform.processor()


def missing_cpu_feature() -> str | None:
    """What vLLM's x86 CPU build needs and this CPU lacks (it is compiled for AVX2 at least)."""
    if platform.machine() != "x86_64":
        return None
    flags = next((l for l in open("/proc/cpuinfo") if l.startswith("flags")), "").split()
    for needed in ["avx2", "fma", "f16c"]:
        if needed not in flags:
            return needed
    return None


def engine(model: str, method: str, k: int, dtype: str, concurrency: int, addr: str,
           extra: dict | None = None, suffix_tree_depth: int | None = None, **kwargs):
    from vllm import LLM

    spec = None
    if method == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 5,
                "prompt_lookup_min": 2}
    elif method == "suffix":
        spec = {"method": "suffix", "num_speculative_tokens": k}
        if suffix_tree_depth is not None:
            # vLLM's default (24) bounds the match plus the draft, and its spec factor (1.0) the
            # draft by the match: 12 tokens at most.
            spec["suffix_decoding_max_tree_depth"] = suffix_tree_depth
    elif method == "sidecar":
        spec = {"method": "custom_class", "model": "infini_sidecar.vllm.SidecarProposer",
                "num_speculative_tokens": k}
    elif method != "plain":
        raise SystemExit(f"unknown method {method!r}")
    additional = {"infini_sidecar": {"addr": addr, **(extra or {})}}
    return LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=4096,
               max_num_seqs=max(concurrency, 1), kv_cache_memory_bytes=1 << 30, seed=0,
               speculative_config=spec, additional_config=additional,
               per_request_spec_decode_metrics="summary" if spec else "none", **kwargs)


def process_cpu_seconds(pid: int) -> float:
    """The user and system CPU seconds of process `pid` so far (0 once it has gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (vLLM's engine processes), from /proc's children lists."""
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def cpu_seconds(engine_pids: list[int], sidecar_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of this process (the engine's front end), of vLLM's engine processes
    (`engine_pids`, found once) and of the sidecar's process: where each part's time went."""
    cpu = {"front_end": process_cpu_seconds(os.getpid()),
           "engines": sum(process_cpu_seconds(p) for p in engine_pids)}
    if sidecar_pid:
        cpu["sidecar"] = process_cpu_seconds(sidecar_pid)
    return cpu


def spec_counts(completion) -> tuple[int, int, int] | None:
    """(drafted, accepted, verify steps with drafts) of one finished request, from vLLM's
    per-request counters; None without speculation. Per request, not vLLM's global counters: a
    second engine in one process unregisters the first's from the metrics registry, so those
    would count the last engine's twice over two engines. vLLM counts a step's accepted drafts
    before it cuts the request at max_tokens, so the last step may count some past the end."""
    metrics = completion.spec_decode_metrics
    if metrics is None:
        return None
    accepted = sum(j * count for j, count in enumerate(metrics.histogram))
    return metrics.num_draft_tokens, accepted, sum(metrics.histogram)


def read_workload(path: str, limit: int | None) -> list[dict]:
    requests = [json.loads(l) for l in open(path) if l.strip()]
    return requests[:limit] if limit else requests


def prompt_ids(tokenizer, request: dict, answers: dict[str, str]) -> list[int]:
    if "prompt" in request:
        return tokenizer.encode(request["prompt"])
    messages = [{"role": m["role"], "content": m["content"] if "content" in m else answers[m["answer_of"]]}
                for m in request["messages"]]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def serve(llm, tokenizer, requests: list[dict], concurrency: int, answers: dict[str, str],
          records: dict[str, dict]) -> None:
    """Runs `requests` on one engine with at most `concurrency` in flight (vLLM's engine loop, so a
    finished request's place is taken at once); a request waits for the answers it quotes."""
    from vllm import SamplingParams

    engine_ = llm.llm_engine
    waiting = list(requests)
    started: dict[str, float] = {}
    while waiting or started:
        while waiting and len(started) < concurrency:
            request = waiting[0]
            quoted = [m["answer_of"] for m in request.get("messages", []) if "answer_of" in m]
            if any(q not in answers for q in quoted):
                break
            waiting.pop(0)
            ids = prompt_ids(tokenizer, request, answers)
            params = SamplingParams(temperature=0.0, max_tokens=request["max_new_tokens"])
            engine_.add_request(request["id"], {"prompt_token_ids": ids}, params)
            started[request["id"]] = time.perf_counter()
            records[request["id"]] = {"prompt_tokens": len(ids), "started": started[request["id"]]}
        for output in engine_.step():
            if not output.finished:
                continue
            done = output.outputs[0]
            record = records[output.request_id]
            record["seconds"] = time.perf_counter() - started.pop(output.request_id)
            record["ended"] = time.perf_counter()
            record["output"] = list(done.token_ids)
            record["spec"] = spec_counts(done)
            answers[output.request_id] = done.text


def part(records: list[dict], cpu: list[dict[str, float]]) -> dict:
    tokens = sum(len(r["output"]) for r in records)
    span = max(r["ended"] for r in records) - min(r["started"] for r in records)
    spec = [r["spec"] for r in records if r["spec"] is not None]
    drafted, accepted, steps = (sum(c[i] for c in spec) for i in range(3)) if spec else (None, None, None)
    return {"requests": len(records), "tokens": tokens, "seconds": span, "tokens_per_s": tokens / span,
            "drafted": drafted, "accepted": accepted, "spec_steps": steps,
            "acceptance": accepted / drafted if drafted else None,
            "cpu_seconds": {k: cpu[-1][k] - cpu[0][k] for k in cpu[0]}}


def run(args) -> None:
    if args.suffix_tree_depth is not None and args.method != "suffix":
        raise SystemExit("--suffix-tree-depth is for --method suffix")
    requests = read_workload(args.workload, args.limit)
    stats = tempfile.mkdtemp(prefix="vllm-sidecar-stats-")
    extra = {"namespace": args.namespace, "learn": True, "stats": None}
    if args.min_path_prob is not None:
        extra["min_path_prob"] = args.min_path_prob
    llms = []
    for replica in range(args.replicas):
        extra["stats"] = os.path.join(stats, f"replica-{replica}.json")
        llms.append(engine(args.model, args.method, args.k, args.dtype, args.concurrency, args.addr,
                           dict(extra), args.suffix_tree_depth))
    tokenizer = llms[0].get_tokenizer()
    # Warm-up, outside the figures: each engine's first pass pays one-time costs.
    from vllm import SamplingParams

    for llm in llms:
        llm.generate({"prompt_token_ids": tokenizer.encode("Hello")}, SamplingParams(max_tokens=4),
                     use_tqdm=False)
    engine_pids = descendants(os.getpid())
    if not engine_pids:
        raise SystemExit("no engine processes found under /proc/PID/task/*/children")
    answers: dict[str, str] = {}
    records: dict[str, dict] = {}
    fifth = max(1, len(requests) // 5)
    marks = {0, fifth, len(requests) - fifth}
    cpu_at: dict[int, dict[str, float]] = {}

    def mark(i: int) -> None:
        cpu_at[i] = cpu_seconds(engine_pids, args.sidecar_pid)

    began = time.perf_counter()
    if args.replicas == 1:
        # CPU seconds at the fifths' edges: requests go in order, so these bound the parts.
        cuts = sorted(marks)
        for a, b in zip(cuts, cuts[1:] + [len(requests)]):
            mark(a)
            serve(llms[0], tokenizer, requests[a:b], args.concurrency, answers, records)
    else:
        for i, request in enumerate(requests):
            if i in marks:
                mark(i)
            serve(llms[i % args.replicas], tokenizer, [request], 1, answers, records)
    mark(len(requests))
    wall = time.perf_counter() - began

    def at(a: int, b: int) -> list[dict[str, float]]:
        return [cpu_at[a], cpu_at[b]]

    ordered = [records[r["id"]] for r in requests]
    sidecar = []
    for path in sorted(Path(stats).glob("*.json")):
        sidecar.append(json.loads(path.read_text()))
    report = {
        "cpu": cpu_name(), "method": args.method, "k": args.k, "dtype": args.dtype,
        "suffix_tree_depth": args.suffix_tree_depth,
        "concurrency": args.concurrency, "replicas": args.replicas, "workload": args.workload,
        "wall_seconds": wall,
        "all": part(ordered, at(0, len(requests))),
        "cold": part(ordered[:fifth], at(0, fifth)),
        "warm": part(ordered[len(requests) - fifth:], at(len(requests) - fifth, len(requests))),
        "sidecar": sidecar,
        "requests": [{"id": r["id"], **{k: v for k, v in records[r["id"]].items()
                                        if k not in ("started", "ended")}} for r in requests],
    }
    Path(args.out).write_text(json.dumps(report))
    print(json.dumps({k: report[k] for k in ("method", "concurrency", "replicas", "all", "cold", "warm")}))


def table(args) -> None:
    runs = [json.loads(Path(p).read_text()) for p in args.runs]
    names = [Path(p).stem for p in args.runs]
    # A run of run_vllm.sh's round N is named NAME-roundN; it is compared with its round's plain run.
    rounds = [n.split("-round")[1] if "-round" in n else "1" for n in names]
    plain = {(k, r["concurrency"], r["replicas"]): r for k, r in zip(rounds, runs) if r["method"] == "plain"}
    print(f"CPU: {runs[0]['cpu']}; dtype {runs[0]['dtype']}; {runs[0]['workload']}\n")
    print("| run | method | concurrency | replicas | tok/s all | warm tok/s | speed-up all | speed-up warm | "
          "acceptance warm | identical to plain | sidecar µs/step | µs/row | warm CPU s: engines, sidecar |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, round_, r in zip(names, rounds, runs):
        base = plain.get((round_, r["concurrency"], r["replicas"]))
        same = "–"
        if base is not None:
            want = {q["id"]: q["output"] for q in base["requests"]}
            equal = sum(1 for q in r["requests"] if want.get(q["id"]) == q["output"])
            same = f"{equal}/{len(r['requests'])}"
        up = lambda key: (f"{r[key]['tokens_per_s'] / base[key]['tokens_per_s']:.2f}×"
                          if base else "–")
        acc = r["warm"]["acceptance"]
        sc = r.get("sidecar") or []
        us_step = (f"{sum(s['seconds'] for s in sc) * 1e6 / max(1, sum(s['steps'] for s in sc)):.0f}"
                   if sc else "–")
        us_row = (f"{sum(s['seconds'] for s in sc) * 1e6 / max(1, sum(s['rows'] for s in sc)):.0f}"
                  if sc else "–")
        cpu = r["warm"].get("cpu_seconds", {})
        cpu_cell = ", ".join(f"{cpu[k]:.1f}" if k in cpu else "–" for k in ("engines", "sidecar"))
        print(f"| {name} | {r['method']} | {r['concurrency']} | {r['replicas']} | {r['all']['tokens_per_s']:.1f} | "
              f"{r['warm']['tokens_per_s']:.1f} | {up('all')} | {up('warm')} | "
              f"{'–' if acc is None else f'{acc:.2f}'} | {same} | {us_step} | {us_row} | {cpu_cell} |")


CHECK_PROMPTS = [
    "Write a short poem about the sea.",
    "List three uses of a suffix array, one line each.",
    "Repeat this sentence twice: the kernel uses a page table to map virtual addresses.",
]


def check(args) -> None:
    """The CI check: (1) the proposer changes no output: every request's greedy output with sidecar
    drafts equals plain decoding's (float32, where vLLM's speculation verifies exactly on CPU), and
    the drafts were used; (2) the mixer's distribution is the sidecar's `Mix` of the same logits: at
    each step of a mixed greedy generation, vLLM's processed log-probs equal those of a unary `Mix`
    given the raw log-probs of the same context (from a plain engine's prompt log-probs)."""
    missing = missing_cpu_feature()
    if missing:
        print(json.dumps({"skipped": f"vLLM's CPU build needs {missing}, which this CPU lacks"}))
        return
    from vllm import SamplingParams

    from infini_sidecar import Sidecar
    from infini_sidecar.client import top_k_logprobs

    dtype = "float32"
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    out = {"cpu": cpu_name()}

    def outputs(llm, prompts, params):
        return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]

    plain = engine(args.model, "plain", 0, dtype, 4, args.addr, logprobs_mode="raw_logprobs",
                   max_logprobs=64)
    tokenizer = plain.get_tokenizer()
    prompts = [{"prompt_token_ids": tokenizer.apply_chat_template(
        [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=True, return_dict=False)} for p in CHECK_PROMPTS]
    want = [list(o.token_ids) for o in outputs(plain, prompts, greedy)]

    # (1) Drafts: each prompt twice, so the second drafts from the live index what the first taught.
    stats = os.path.join(tempfile.mkdtemp(), "proposer.json")
    drafting = engine(args.model, "sidecar", 8, dtype, 4, args.addr,
                      {"namespace": "vllm-check", "learn": True, "stats": stats})
    drafted_outputs = outputs(drafting, prompts + prompts, greedy)
    got = [list(o.token_ids) for o in drafted_outputs]
    drafted, accepted = (sum(spec_counts(o)[i] for o in drafted_outputs) for i in range(2))
    out["proposer"] = {"identical": sum(g == w for g, w in zip(got, want + want)),
                       "requests": len(got), "drafted": drafted, "accepted": accepted}
    del drafting
    print(json.dumps({"proposer": out["proposer"]}), file=sys.stderr, flush=True)

    # (2) Mixing under the λ1/λ2 rule (the adaptive rule's λ depends on the sequence's history,
    # which a unary Mix does not have).
    k = 20
    mixing = engine(args.model, "plain", 0, dtype, 4, args.addr,
                    {"mix": "all", "rule": "split", "top_k": 64},
                    logits_processors=["infini_sidecar.vllm:SidecarMixer"],
                    logprobs_mode="processed_logprobs")
    mixed_params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=k)
    mixed = outputs(mixing, prompts, mixed_params)
    del mixing
    sidecar = Sidecar(args.addr, timeout=30)
    worst, steps, differ = 0.0, 0, 0
    for prompt, m, w in zip(prompts, mixed, want):
        ids = prompt["prompt_token_ids"]
        differ += list(m.token_ids) != w
        # The raw log-probs of every position of prompt + mixed output, in one pass.
        full = ids + list(m.token_ids)
        raw = plain.generate({"prompt_token_ids": full},
                             SamplingParams(max_tokens=1, prompt_logprobs=64), use_tqdm=False)[0]
        for j, token_logprobs in enumerate(m.logprobs):
            position = len(ids) + j
            raw_here = raw.prompt_logprobs[position]
            top = sorted(raw_here.items(), key=lambda kv: -kv[1].logprob)[:64]
            answer = sidecar.mix(full[:position], top_k_logprobs=top_k_logprobs(
                [t for t, _ in top], [lp.logprob for _, lp in top]), rule="split", top_k=k)
            for entry in answer.top:
                if entry.token in token_logprobs:
                    got_lp = token_logprobs[entry.token].logprob
                    worst = max(worst, abs(math.exp(got_lp) - entry.prob))
            steps += 1
    out["mixer"] = {"steps": steps, "max_abs_prob_difference": worst,
                    "outputs_differing_from_plain": differ}
    print(json.dumps(out))


def replay(args) -> None:
    """The run's outputs with their prompts ([[prompt ids, output ids], ...] in request order), so
    drafters can be replayed over the tokens vLLM decoded; the prompts are built again as `run`
    built them (a quoted answer is its output's text), and must have the lengths the run recorded."""
    from transformers import AutoTokenizer

    report = json.loads(Path(args.run).read_text())
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    answers: dict[str, str] = {}
    pairs = []
    for request, record in zip(read_workload(report["workload"], None), report["requests"]):
        ids = prompt_ids(tokenizer, request, answers)
        if len(ids) != record["prompt_tokens"]:
            raise SystemExit(f"{request['id']}: {len(ids)} prompt tokens, the run had {record['prompt_tokens']}")
        pairs.append([list(ids), record["output"]])
        answers[request["id"]] = tokenizer.decode(record["output"], skip_special_tokens=True)
    Path(args.out).write_text(json.dumps(pairs))


def drive(args) -> None:
    """vLLM's drafter without running vLLM (its package is still imported): `SidecarProposer` over
    the outputs of a replay.json (`replay`), against the sidecar on --addr, each step verified
    greedily against the recorded output as vLLM verifies a chain (the draft's agreeing tokens and
    one more). Request i goes to proposer i % --replicas and runs to its end before the next
    starts, as `run --replicas` sends them. Seconds instead of a vLLM run: each request's steps and
    drafts through the proposer's real path (its mirror, one `Batch` stream, the server's live
    index), to set beside a run's per-request counters or `eval workload --replay`. `accepted`
    counts the tokens the output kept; vLLM's counter also counts drafts accepted past the end."""
    from types import SimpleNamespace

    import numpy as np

    from infini_sidecar.vllm import SidecarProposer

    pairs = json.loads(Path(args.replay).read_text())
    for i, (prompt, output) in enumerate(pairs):
        if len(prompt) + len(output) > args.max_model_len:
            raise SystemExit(f"request {i}: {len(prompt) + len(output)} tokens, over --max-model-len")
    if not pairs:
        raise SystemExit(f"{args.replay} holds no requests")
    namespace = args.namespace or f"drive-{os.getpid()}"
    config = SimpleNamespace(
        additional_config={"infini_sidecar": {"addr": args.addr, "namespace": namespace,
                                              "learn": True}},
        speculative_config=SimpleNamespace(num_speculative_tokens=args.k),
        model_config=SimpleNamespace(max_model_len=args.max_model_len))
    proposers = [SidecarProposer(config) for _ in range(args.replicas)]
    rows = np.zeros((1, args.max_model_len), dtype=np.int64)

    def propose(proposer, prompt: list[int], output: list[int], done: int) -> list[int]:
        n = len(prompt) + done
        rows[0, :n] = prompt + output[:done]
        return proposer.propose([[output[done - 1]]], np.array([n]), rows)[0]

    counts = []
    for i, (prompt, output) in enumerate(pairs):
        proposer = proposers[i % args.replicas]
        # plain_steps: the decode steps plain vLLM takes for the same output.
        c = {"steps": 0, "steps_with_drafts": 0, "drafted": 0, "accepted": 0,
             "plain_steps": max(0, len(output) - 1)}
        # vLLM's prefill gives the first token; the drafter is asked from the second on.
        done = min(1, len(output))
        while 0 < done < len(output):
            draft = propose(proposer, prompt, output, done)
            agree = 0
            while (agree < len(draft) and done + agree < len(output)
                   and draft[agree] == output[done + agree]):
                agree += 1
            c["steps"] += 1
            c["steps_with_drafts"] += bool(draft)
            c["drafted"] += len(draft)
            c["accepted"] += agree
            done += min(agree + 1, len(output) - done)
        if done:
            # vLLM asks the drafter once more in the step that ends a request: the sidecar learns
            # its last tokens. Not a step of the request's.
            propose(proposer, prompt, output, done)
        counts.append(c)
    fifth = max(1, len(pairs) // 5)
    parts = {"all": counts, "cold": counts[:fifth], "warm": counts[len(pairs) - fifth:]}
    summary = {part: {key: sum(c[key] for c in chosen) for key in counts[0]}
               for part, chosen in parts.items()}
    out = {"replay": args.replay, "k": args.k, "replicas": args.replicas, "namespace": namespace,
           "summary": summary, "requests": counts}
    Path(args.out).write_text(json.dumps(out))
    print(json.dumps(summary))


def costs(args) -> None:
    """What a drafted token costs vLLM, as a share of a decode step: each run's requests' seconds
    fitted by least squares to a constant, their prompt tokens, decode steps (output tokens after
    the first, less those drafts supplied) and drafted tokens. The drafter's bars weigh a longer
    draft against this share (infini_sidecar.vllm.DEFAULTS). Runs whose requests overlapped
    (concurrency above 1) are refused: a request's seconds are then not its own."""
    import numpy as np

    for path in args.runs:
        r = json.loads(Path(path).read_text())
        if "method" not in r or "requests" not in r:
            raise SystemExit(f"{path}: not a `run`'s JSON")
        if r["concurrency"] != 1:
            raise SystemExit(f"{path}: concurrency {r['concurrency']}; per-request seconds need 1")
        if r["method"] == "plain":
            raise SystemExit(f"{path}: plain decoding drafts nothing to fit")
        rows, seconds = [], []
        for q in r["requests"]:
            decoded = len(q["output"]) - 1
            drafted, accepted, _ = q["spec"]
            rows.append([1.0, q["prompt_tokens"], decoded - min(accepted, decoded), drafted])
            seconds.append(q["seconds"])
        (const, prompt, step, draft), *_ = np.linalg.lstsq(np.array(rows), np.array(seconds), rcond=None)
        print(f"{Path(path).stem}: {1e3 * const:.0f} ms a request + {1e3 * prompt:.2f} ms a prompt token "
              f"+ {1e3 * step:.1f} ms a decode step + {1e3 * draft:.2f} ms a drafted token "
              f"= {draft / step:.3f} of a step ({len(rows)} requests)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--model", required=True)
    r.add_argument("--workload", required=True)
    r.add_argument("--method", required=True, choices=["plain", "ngram", "suffix", "sidecar"])
    r.add_argument("--concurrency", type=int, default=1)
    r.add_argument("--replicas", type=int, default=1, choices=range(1, 9), metavar="1..8")
    r.add_argument("--k", type=int, default=16, help="num_speculative_tokens")
    r.add_argument("--suffix-tree-depth", type=int,
                   help="suffix_decoding_max_tree_depth for --method suffix (default vLLM's, 24)")
    r.add_argument("--dtype", default="bfloat16")
    r.add_argument("--limit", type=int, help="the first N requests only")
    r.add_argument("--addr", default="127.0.0.1:50051")
    r.add_argument("--namespace", default="vllm")
    r.add_argument("--min-path-prob", type=float)
    r.add_argument("--sidecar-pid", type=int, help="the sidecar's process, whose CPU time each part reports")
    r.add_argument("--out", required=True)
    t = sub.add_parser("table")
    t.add_argument("runs", nargs="+")
    c = sub.add_parser("check")
    c.add_argument("--model", required=True)
    c.add_argument("--addr", default="127.0.0.1:50051")
    c.add_argument("--max-tokens", type=int, default=40)
    p = sub.add_parser("replay")
    p.add_argument("run")
    p.add_argument("--model", required=True, help="the model folder, for its tokenizer")
    p.add_argument("--out", required=True)
    d = sub.add_parser("drive")
    d.add_argument("replay", help="a replay.json (the `replay` command's)")
    d.add_argument("--addr", default="127.0.0.1:50051")
    d.add_argument("--namespace", help="the live namespace it learns into (default: a new one)")
    d.add_argument("--k", type=int, default=16, help="num_speculative_tokens")
    d.add_argument("--replicas", type=int, default=1, choices=range(1, 9), metavar="1..8")
    d.add_argument("--max-model-len", type=int, default=4096)
    d.add_argument("--out", required=True)
    f = sub.add_parser("costs")
    f.add_argument("runs", nargs="+", help="run JSONs of speculative methods at concurrency 1")
    args = parser.parse_args()
    {"run": run, "table": table, "check": check, "replay": replay, "drive": drive,
     "costs": costs}[args.command](args)


if __name__ == "__main__":
    main()
