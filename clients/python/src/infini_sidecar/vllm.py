"""vLLM as the inference engine, the sidecar beside it:

- `SidecarProposer`, vLLM's drafter: `speculative_config={"method": "custom_class",
  "model": "infini_sidecar.vllm.SidecarProposer", "num_speculative_tokens": K}`. Each engine step
  it drafts a chain of at most K tokens for every running request (∞-gram, prompt lookup and the live
  index, the length chosen by the sidecar's calibrated drafter), and with `learn` the live index
  learns what the engine generated, searchable at once by every engine that shares the sidecar.
- `SidecarMixer`, a logits processor: `logits_processors=["infini_sidecar.vllm:SidecarMixer"]`
  (`--logits-processors infini_sidecar.vllm:SidecarMixer`). The requests that ask for it (or all)
  sample from λ·P∞ + (1−λ)·P_vLLM, under the sidecar's default rule (the adaptive λ with the copy
  guard) or the request's. vLLM 0.32 takes no custom logits processor while speculative decoding is
  on, so an engine mixes or drafts through the sidecar, not both.

Each keeps the engine's running sequences mirrored in one sidecar `Batch` stream
(`infini_sidecar.mirror`): one message per engine step for the whole batch, carrying each sequence's
new tokens (and what it took back) with its request.

Settings, by precedence: vLLM's own config (`additional_config={"infini_sidecar": {...}}`), the
environment (`INFINI_SIDECAR_ADDR`, ...), the defaults in `DEFAULTS`. Per request (the mixer):
`extra_args` (the OpenAI server's `vllm_xargs`) `infini_sidecar_mix` (1: mix this request),
`infini_sidecar_rule` ("split", "gate", "adaptive" or a fixed λ) and `infini_sidecar_namespace`.

A sidecar that cannot be reached, or that answers late, never stops the engine: that step's rows get
no drafts (or keep vLLM's logits), a warning is logged, and the next step opens a new stream. With
`stats` set to a path, each component writes its counters there (JSON, every 64 steps and at exit):
engine steps, the seconds it spent in them, rows, drafted tokens, failures.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Hashable, Optional

import torch
from vllm.v1.sample.logits_processor import LogitsProcessor, MoveDirectionality

from . import sidecar_pb2 as pb
from .client import Rule, Sidecar, draft_options, mixed_log_probs, top_k_logprobs
from .errors import SidecarError
from .mirror import MirroredBatch, Row, as_list
from .streams import Batch

logger = logging.getLogger("infini_sidecar.vllm")

#: Every setting and its default.
DEFAULTS: dict[str, Any] = {
    # The sidecar's gRPC address, its bearer token, and the most seconds a step waits for it.
    "addr": "127.0.0.1:50051",
    "token": None,
    "timeout": 2.0,
    # The live namespace sequences draft from (and learn into, with `learn`); per request for the
    # mixer (`infini_sidecar_namespace`).
    "namespace": "",
    "learn": False,
    # Drafts: "all", "index", "prompt", "live" or "reference", and the drafter's bars (None: the
    # sidecar's own). vLLM verifies a drafted token for 5–11% of a decode step on CPU (a fit of its
    # runs' per-request seconds, `vllm_sidecar.py costs`: 5% on a Xeon with AMX, 9–11% on an AVX2
    # EPYC), under half of what a row costs in the sidecar's own loop, so drafts here go further on
    # weaker evidence: a lower path bar, up to twice the matched length, tokens down to 0.2 likely.
    # Chosen leave-one-workload-out at 5.5% (eval/choose_draft_defaults.py --drive): 3% fewer step
    # equivalents than the sidecar's own bars there, level with them at 11% (eval/RESULTS.md).
    "source": "all",
    "min_path_prob": 0.1,
    "match_len_factor": 2.0,
    "min_token_prob": 0.2,
    # Mixing: "request" (the requests whose extra_args ask) or "all"; the default λ rule (None: the
    # sidecar's); the top-k log-probs sent and the mixed top-k returned.
    "mix": "request",
    "rule": None,
    "top_k": 64,
    # A file for the counters, or None.
    "stats": None,
}

_ENV_PREFIX = "INFINI_SIDECAR_"


def _parse(name: str, text: str) -> Any:
    default = DEFAULTS[name]
    if isinstance(default, bool):
        return text.strip().lower() in ("1", "true", "yes", "on")
    if isinstance(default, int):
        return int(text)
    if isinstance(default, float):
        return float(text)
    if name == "rule":
        try:
            return float(text)
        except ValueError:
            return text
    return text


def settings(vllm_config: Any = None) -> dict[str, Any]:
    """The settings for an engine: vLLM's `additional_config["infini_sidecar"]`, then the
    environment, then `DEFAULTS`. An unknown name is an error, not a silent no-op."""
    given = dict(getattr(vllm_config, "additional_config", None) or {}).get("infini_sidecar", {})
    unknown = set(given) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown infini_sidecar settings {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    out = dict(DEFAULTS)
    for name in DEFAULTS:
        env = os.environ.get(_ENV_PREFIX + name.upper())
        if env is not None and env != "":
            out[name] = _parse(name, env)
    out.update(given)
    if out["mix"] not in ("request", "all"):
        raise ValueError(f"infini_sidecar mix is 'request' or 'all', not {out['mix']!r}")
    return out


def _connect(conf: dict[str, Any]) -> MirroredBatch:
    return MirroredBatch(Sidecar(conf["addr"], token=conf["token"], timeout=conf["timeout"]))


@dataclass
class Stats:
    """What a component did: engine steps, the seconds it spent in them, sequences served, drafted
    tokens (the proposer), and steps that failed."""
    steps: int = 0
    seconds: float = 0.0
    rows: int = 0
    drafted: int = 0
    failures: int = 0
    path: Optional[str] = field(default=None, repr=False)

    def step(self, started: float, rows: int) -> None:
        self.steps += 1
        self.seconds += time.perf_counter() - started
        self.rows += rows
        if self.path and self.steps % 64 == 0:
            self.write()

    def write(self) -> None:
        if not self.path:
            return
        fields = {k: v for k, v in self.__dict__.items() if k != "path"}
        fields["us_per_step"] = 1e6 * self.seconds / max(1, self.steps)
        fields["us_per_row"] = 1e6 * self.seconds / max(1, self.rows)
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(fields, f)
        os.replace(tmp, self.path)


def _failed(stats: Stats, what: str, error: SidecarError) -> None:
    stats.failures += 1
    # The first failure and then one in a hundred: a sidecar that is down fails every step.
    if stats.failures == 1 or stats.failures % 100 == 0:
        logger.warning("infini-sidecar %s failed (%d so far); the engine goes on without it: %s",
                       what, stats.failures, error)


class SidecarProposer:
    """vLLM's `custom_class` drafter. vLLM passes no request ids, so each row is matched to the
    sequence it continues by its tokens: the sequence that row held at the last step if the row
    still extends it, else the longest sequence the row extends, else a new one. A sequence no row
    continues has left the batch and finishes."""

    def __init__(self, vllm_config: Any):
        self.conf = settings(vllm_config)
        self.k = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len = vllm_config.model_config.max_model_len
        self.mirror = _connect(self.conf)
        self.stats = Stats(path=self.conf["stats"])
        atexit.register(self.stats.write)
        #: The options of a full-length draft, built once (a row near the length limit gets its own).
        self.full_draft = self._options(self.k)
        #: Engine row → the mirrored sequence it held at the last step.
        self.rows: dict[int, int] = {}
        self.next_key = 0

    def _options(self, room: int) -> pb.DraftOptions:
        return draft_options(max_tokens=room, source=self.conf["source"],
                             min_path_prob=self.conf["min_path_prob"],
                             match_len_factor=self.conf["match_len_factor"],
                             min_token_prob=self.conf["min_token_prob"])

    def _match(self, row: int, tokens: list[int], claimed: set) -> int:
        def extends(key: Hashable) -> bool:
            held = self.mirror.tokens(key)
            return held is not None and len(held) <= len(tokens) and tokens[:len(held)] == held

        key = self.rows.get(row)
        if key is not None and key not in claimed and extends(key):
            return key
        candidates = [k for k in self.mirror.sequences if k not in claimed and extends(k)]
        if candidates:
            return max(candidates, key=lambda k: len(self.mirror.tokens(k)))
        self.next_key += 1
        return self.next_key

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, **_ignored) -> list[list[int]]:
        started = time.perf_counter()
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        rows, places, claimed, held_by = [], [], set(), {}
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            room = min(self.k, self.max_model_len - n - 1)
            # No sample: a prefill still in chunks.
            if not sampled or room <= 0:
                continue
            tokens = as_list(token_ids_cpu[i, :n])
            key = self._match(i, tokens, claimed)
            claimed.add(key)
            held_by[i] = key
            draft = self.full_draft if room == self.k else self._options(room)
            rows.append(Row(key, tokens, draft=draft, namespace=self.conf["namespace"],
                            learn=self.conf["learn"]))
            places.append((i, room))
        finished = [k for k in self.mirror.sequences if k not in claimed]
        self.rows = held_by
        try:
            results = self.mirror.step(rows, finished)
        except SidecarError as e:
            _failed(self.stats, "drafting", e)
            self.rows = {}
            return drafts
        for (i, room), result in zip(places, results):
            if result.HasField("error"):
                _failed(self.stats, "a row's draft", SidecarError(result.error.message))
                continue
            drafts[i] = list(result.draft.token_ids[:room])
            self.stats.drafted += len(drafts[i])
        self.stats.step(started, len(rows))
        return drafts

    def load_model(self, *args, **kwargs) -> None:
        """vLLM asks drafters to load their model: the sidecar's is in the sidecar."""


def _request_options(params: Any, conf: dict[str, Any]) -> Optional[tuple[str, Rule]]:
    """(namespace, rule) when a request is to be mixed, from its `extra_args`; None otherwise."""
    extra = getattr(params, "extra_args", None) or {}
    asked = extra.get("infini_sidecar_mix")
    wanted = conf["mix"] == "all" if asked is None else str(asked).lower() in ("1", "true", "yes", "on")
    if not wanted:
        return None
    rule = extra.get("infini_sidecar_rule", conf["rule"])
    if isinstance(rule, str):
        try:
            rule = float(rule)
        except ValueError:
            pass
    namespace = str(extra.get("infini_sidecar_namespace", conf["namespace"]))
    return namespace, rule


@dataclass
class _Mixed:
    key: int
    prompt: list[int]
    #: vLLM's running list of the request's output tokens (it appends to it).
    output: list[int]
    namespace: str
    rule: Rule


class SidecarMixer(LogitsProcessor):
    """Mixes the ∞-gram into vLLM's distribution for the requests that ask, one `Batch` message per
    step: each row's top-k log-probs go to the sidecar, which returns the mixed top-k; those tokens
    get their mixed log-probs and every other token vLLM's, scaled so that together they hold the
    mix's rest (`client.mixed_log_probs`). The result is a log-distribution over the whole vocabulary,
    so every sampler works on it."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool):
        self.conf = settings(vllm_config)
        self.mirror = _connect(self.conf)
        self.stats = Stats(path=self.conf["stats"])
        atexit.register(self.stats.write)
        #: Batch index → the mixed request there.
        self.requests: dict[int, _Mixed] = {}
        self.finished: list[int] = []
        self.next_key = 0

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        extra = getattr(sampling_params, "extra_args", None) or {}
        rule = extra.get("infini_sidecar_rule")
        if rule is not None:
            try:
                float(rule)
            except (TypeError, ValueError):
                if rule not in ("default", "split", "gate", "adaptive"):
                    raise ValueError(f"infini_sidecar_rule {rule!r}: 'split', 'gate', 'adaptive' "
                                     "or a fixed λ in [0, 1]")

    def is_argmax_invariant(self) -> bool:
        return False

    def _leave(self, index: int) -> None:
        request = self.requests.pop(index, None)
        if request is not None:
            self.finished.append(request.key)

    def update_state(self, batch_update: Any) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self._leave(index)
        for index, params, prompt, output in batch_update.added:
            self._leave(index)
            options = _request_options(params, self.conf)
            if options is not None:
                self.next_key += 1
                self.requests[index] = _Mixed(self.next_key, list(prompt or []), output, *options)
        for a, b, direction in batch_update.moved:
            moving = self.requests.pop(a, None)
            if direction == MoveDirectionality.SWAP:
                other = self.requests.pop(b, None)
                if other is not None:
                    self.requests[a] = other
            else:
                self._leave(b)
            if moving is not None:
                self.requests[b] = moving

    def apply(self, logits):
        if not self.requests and not self.finished:
            return logits
        started = time.perf_counter()
        indices = sorted(self.requests)
        finished, self.finished = self.finished, []
        logprobs = torch.log_softmax(logits[indices].to(torch.float64), dim=-1) if indices else None
        rows = []
        if indices:
            top = torch.topk(logprobs, min(self.conf["top_k"], logprobs.shape[-1]), dim=-1)
            for j, index in enumerate(indices):
                request = self.requests[index]
                neural = top_k_logprobs(top.indices[j].tolist(), top.values[j].tolist())
                mix = Batch.mix_request(top_k_logprobs=neural, rule=request.rule,
                                        top_k=self.conf["top_k"])
                rows.append(Row(request.key, request.prompt + list(request.output), mix=mix,
                                namespace=request.namespace))
        try:
            results = self.mirror.step(rows, finished)
        except SidecarError as e:
            _failed(self.stats, "mixing", e)
            return logits
        for j, (index, result) in enumerate(zip(indices, results)):
            if result.HasField("error"):
                _failed(self.stats, "a row's mix", SidecarError(result.error.message))
                continue
            tokens, values, shift = mixed_log_probs(result.mix, logprobs[j])
            row = logprobs[j] + shift
            row[tokens] = torch.tensor(values, dtype=row.dtype)
            logits[index] = row.to(logits.dtype)
        self.stats.step(started, len(rows))
        return logits
