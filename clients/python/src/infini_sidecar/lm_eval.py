"""lm-evaluation-harness through the sidecar: the model `infini-sidecar` and Pile-style perplexity tasks.

    infini-sidecar-lm-eval run --model infini-sidecar \
        --model_args addr=127.0.0.1:50051,mode=mixed --tasks sidecar_pile

`infini-sidecar-lm-eval` is lm_eval's own command line with this model registered and this package's
tasks on the include path (lm_eval has no plugin entry point for models); in Python, importing this
module registers the model for `lm_eval.simple_evaluate(model="infini-sidecar", ...)`.

Model args: `addr`, `token`, `mode` (`mixed`: λ·P∞ + (1−λ)·P_model, `neural`: the sidecar's model
alone, `infgram`: the ∞-gram alone, −∞ for a token it never saw follow), `rule` (`default`: the
mixing file's, `split`, `gate`, `adaptive`, or a fixed λ), `docs_per_call` (documents per Score call).

How the numbers map onto `infini-sidecar eval ppl`: `loglikelihood_rolling` scores a whole document
in one `Score` call, with the evaluator's protocol (windows of 1024 tokens with stride 512, each token
scored once with at least 512 tokens of context once past the first window), not lm_eval's disjoint
windows. The first token is context only (SmolLM2 has no BOS token to predict it from), as in `eval
ppl`; so lm_eval's word and byte perplexities are `eval ppl`'s summed log-loss over the words and
bytes of the documents, on the same tokens.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional

from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from .client import Sidecar

MODES = ("mixed", "neural", "infgram")
TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def parse_rule(rule: str):
    if rule in ("default", "split", "gate", "adaptive"):
        return None if rule == "default" else rule
    try:
        return float(rule)
    except ValueError:
        raise ValueError(f"rule {rule!r}: default, split, gate, adaptive or a number") from None


@register_model("infini-sidecar")
class SidecarLM(LM):
    def __init__(self, addr: str = "127.0.0.1:50051", token: Optional[str] = None, mode: str = "mixed",
                 rule: str = "default", docs_per_call: int = 16, max_gen_toks: int = 256, **_):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        self.sidecar = Sidecar(str(addr), token)
        self.mode = mode
        self.rule = 1.0 if mode == "infgram" else parse_rule(str(rule))
        self.docs_per_call = int(docs_per_call)
        self.max_gen_toks = int(max_gen_toks)
        self.eos = self.sidecar.info().eos_token_id

    def _token_logprobs(self, docs: list[list[int]]) -> list[list[float]]:
        """Each document's per-token log-probs (all tokens but the first) in the chosen mode."""
        out = []
        for start in range(0, len(docs), self.docs_per_call):
            chunk = docs[start:start + self.docs_per_call]
            for item in self.sidecar.score(chunk, per_token=True, rule=self.rule):
                if not item.HasField("document"):
                    continue
                scores = item.document.token_scores
                if self.mode == "neural":
                    out.append([s.neural_logprob for s in scores])
                elif self.mode == "infgram":
                    out.append([math.log(s.infgram_prob) if s.infgram_prob > 0 else -math.inf for s in scores])
                else:
                    out.append([s.mixed_logprob for s in scores])
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        docs = [self.sidecar.tokenize(r.args[0]) for r in requests]
        return [sum(lps) for lps in self._token_logprobs(docs)]

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """log P(continuation | context), and whether each continuation token was the most likely
        one (the sidecar's own model run through a Batch stream, one sequence per request)."""
        pairs = [(self.sidecar.tokenize(r.args[0]), self.sidecar.tokenize(r.args[1])) for r in requests]
        joined = [ctx + cont for ctx, cont in pairs]
        logprobs = self._token_logprobs(joined)
        greedy = self._greedy_matches(pairs)
        return [(sum(lps[len(lps) - len(cont):]), g) for lps, (_, cont), g in zip(logprobs, pairs, greedy)]

    def _mix_request(self, batch):
        rule = 0.0 if self.mode == "neural" else self.rule
        return batch.mix_request(own_model=True, rule=rule, top_k=1, max_match=2**31)

    def _greedy_matches(self, pairs) -> list[bool]:
        with self.sidecar.batch() as batch:
            mix = self._mix_request(batch)
            # A sequence's first step starts it with its context and asks for the next token.
            answers = batch.step([batch.part(i, start=ctx, use_model=True, mix=mix)
                                  for i, (ctx, _) in enumerate(pairs)])
            matches = [True] * len(pairs)
            for depth in range(max((len(c) for _, c in pairs), default=0)):
                parts = []
                for i, (_, cont) in enumerate(pairs):
                    if depth < len(cont) and matches[i]:
                        top = answers[i].mix.top[0].token if answers[i].mix.top else None
                        matches[i] = top == cont[depth]
                        last = depth + 1 == len(cont)
                        if matches[i] and not last:
                            parts.append(batch.part(i, append=[cont[depth]], mix=mix))
                by_id = {r.id: r for r in batch.step(parts)} if parts else {}
                answers = [by_id.get(i, answers[i]) for i in range(len(pairs))]
        return matches

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations by the sidecar's own model (mixed with the ∞-gram in mode `mixed`),
        all requests decoded together through one Batch stream."""
        contexts = [self.sidecar.tokenize(r.args[0]) for r in requests]
        options = [r.args[1] or {} for r in requests]
        until = [o.get("until") or [] for o in options]
        until = [[u] if isinstance(u, str) else list(u) for u in until]
        limits = [int(o.get("max_gen_toks", self.max_gen_toks)) for o in options]
        outputs: list[list[int]] = [[] for _ in requests]
        texts = [""] * len(requests)
        with self.sidecar.batch() as batch:
            mix = self._mix_request(batch)
            answers = batch.step([batch.part(i, start=c, use_model=True, mix=mix)
                                  for i, c in enumerate(contexts)])
            live = set(range(len(requests)))
            while live:
                parts = []
                for r in answers:
                    i = r.id
                    token = r.mix.top[0].token
                    if token == self.eos:
                        live.discard(i)
                        parts.append(batch.part(i, finish=True))
                        continue
                    outputs[i].append(token)
                    texts[i] = self.sidecar.detokenize(outputs[i])
                    stop = next((s for s in until[i] if s and s in texts[i]), None)
                    if stop is not None or len(outputs[i]) >= limits[i]:
                        if stop is not None:
                            texts[i] = texts[i][: texts[i].index(stop)]
                        live.discard(i)
                        parts.append(batch.part(i, finish=True))
                    else:
                        parts.append(batch.part(i, append=[token], mix=mix))
                answers = [r for r in batch.step(parts) if r.id in live]
        return texts


def main() -> None:
    """lm_eval's command line, with the `infini-sidecar` model registered and this package's tasks
    included."""
    from lm_eval.__main__ import cli_evaluate

    args = sys.argv[1:]
    if "--include_path" not in args and args[:1] != ["ls"]:
        args += ["--include_path", str(TASKS_DIR)]
    sys.argv = [sys.argv[0]] + args
    cli_evaluate()


if __name__ == "__main__":
    main()
