"""llama.cpp (llama-cpp-python) as the inference engine, the sidecar beside it:

- `SidecarDraftModel` plugs into `Llama(..., draft_model=...)`: each call drafts a chain continuing
  llama.cpp's sequence through a sidecar session (∞-gram, prompt lookup and the live index).
- `SidecarLogitsProcessor` goes in `logits_processor=`: it sends llama.cpp's top-k log-probs and gets
  the mixed top-k back, λ·P∞ + (1−λ)·P_llama.

Both keep one sidecar sequence in step with llama.cpp's tokens (`infini_sidecar.mirror`): each call
sends only the tokens after the longest prefix the sidecar already has (taking back what llama.cpp
rejected) with its request, in one `Batch` message, so a call is one round trip and O(new tokens) of
work. The GGUF's tokenizer must be the index's (`Info.tokenizer_fingerprint`).
A call waits at most the `Sidecar`'s `timeout`; one that is refused or times out raises, and the next
call starts the sequence again.
"""
from __future__ import annotations

import time
from typing import Optional, Sequence

import numpy as np
from llama_cpp import LlamaDraftModel

from . import sidecar_pb2 as pb
from .client import Rule, Sidecar, draft_options, mixed_log_probs, top_k_logprobs
from .errors import from_step_error
from .mirror import MirroredBatch, Row
from .streams import Batch


class _MirroredSequence:
    """llama.cpp's one sequence mirrored in a sidecar `Batch` stream (`MirroredBatch`): a call is
    one round trip. A call the sidecar refuses raises, and the next call starts the sequence afresh;
    one that ends the stream (a timeout, the sidecar gone) raises, and the next opens a new stream."""

    def __init__(self, sidecar: Sidecar, namespace: str = "", learn: bool = False):
        self.mirror = MirroredBatch(sidecar)
        self.namespace, self.learn = namespace, learn

    def step(self, input_ids: Sequence[int], mix: Optional[pb.SessionMix] = None,
             draft: Optional[pb.DraftOptions] = None) -> pb.SequenceResult:
        row = Row(0, input_ids, mix=mix, draft=draft, namespace=self.namespace, learn=self.learn)
        result = self.mirror.step([row])[0]
        if result.HasField("error"):
            raise from_step_error(result.error)
        return result

    @property
    def tokens(self) -> Optional[list[int]]:
        """The tokens the sidecar holds, if it holds the sequence."""
        return self.mirror.tokens(0)

    @property
    def batch(self) -> Optional[Batch]:
        return self.mirror.batch

    def close(self) -> None:
        self.mirror.close()


class SidecarDraftModel(LlamaDraftModel):
    """Drafts for llama.cpp's speculative decoding from a sidecar: a chain of at most `max_tokens`
    (SuffixDecoding-style adaptive length: only tokens likely enough to be accepted)."""

    def __init__(self, sidecar: Sidecar, max_tokens: int = 8, source: str = "all", namespace: str = "",
                 learn: bool = False, min_path_prob: Optional[float] = None):
        self.mirror = _MirroredSequence(sidecar, namespace, learn)
        self.options = draft_options(max_tokens=max_tokens, source=source, min_path_prob=min_path_prob)
        #: Seconds spent in calls, and how many calls and drafted tokens: the drafter's own cost.
        self.seconds = 0.0
        self.calls = 0
        self.drafted = 0

    def __call__(self, input_ids, /, **kwargs) -> np.ndarray:
        started = time.perf_counter()
        draft = self.mirror.step(input_ids, draft=self.options).draft
        self.seconds += time.perf_counter() - started
        self.calls += 1
        self.drafted += len(draft.token_ids)
        return np.array(draft.token_ids, dtype=np.intc)

    def close(self) -> None:
        self.mirror.close()


class SidecarLogitsProcessor:
    """Replaces llama.cpp's logits by the mixed distribution's log-probs.

    llama.cpp's `top_k` log-probs (and the mass of the rest) go to the sidecar, which mixes them with
    the ∞-gram under `rule` (default: the mixing file's, the adaptive λ with the copy guard) and
    returns the mixed `return_k` most likely tokens. Those get their exact mixed log-probs; every other
    token llama.cpp's probability, scaled so that together they hold the mix's rest
    (`client.mixed_log_probs`). The result is a log-distribution over the whole vocabulary, so any
    sampler (greedy, top-p, temperature) works on it."""

    def __init__(self, sidecar: Sidecar, rule: Rule = None, top_k: int = 64, return_k: int = 64,
                 max_match: int = 0):
        self.mirror = _MirroredSequence(sidecar)
        self.rule, self.top_k, self.return_k, self.max_match = rule, top_k, return_k, max_match
        self.seconds = 0.0
        self.calls = 0
        #: The last mix's answer (λ, suffix length, the mixed top-k).
        self.last: Optional[pb.MixResponse] = None

    def __call__(self, input_ids, scores) -> np.ndarray:
        started = time.perf_counter()
        logits = np.asarray(scores, dtype=np.float64)
        logprobs = logits - logits.max()
        logprobs -= np.log(np.exp(logprobs).sum())
        top = np.argpartition(-logprobs, self.top_k)[: self.top_k]
        neural = top_k_logprobs(top.tolist(), logprobs[top].tolist())
        request = Batch.mix_request(top_k_logprobs=neural, rule=self.rule, top_k=self.return_k,
                                    max_match=self.max_match)
        mixed = self.mirror.step(input_ids, mix=request).mix
        tokens, values, shift = mixed_log_probs(mixed, logprobs)
        out = logprobs + shift
        out[tokens] = values
        self.last = mixed
        self.seconds += time.perf_counter() - started
        self.calls += 1
        return out.astype(np.float32)

    def close(self) -> None:
        self.mirror.close()
