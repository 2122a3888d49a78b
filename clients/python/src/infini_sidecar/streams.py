"""The two decoding streams: `Session` (one sequence, one step a message) and `Batch` (an engine's
whole batch, one engine step a message). Each call sends one message and waits for its answer."""
from __future__ import annotations

import queue
from typing import Iterable, Optional, Sequence

import grpc

from . import sidecar_pb2 as pb
from .client import Rule, draft_options, lambda_rule, neural_fields
from .errors import SidecarError, from_rpc_error, from_step_error


class _Stream:
    """A bidirectional stream driven one message at a time; closed with `close()` or `with`."""

    def __init__(self, method, metadata):
        self._queue: queue.Queue = queue.Queue()
        self._replies = method(iter(self._queue.get, None), metadata=metadata)

    def _send(self, message):
        self._queue.put(message)
        try:
            return next(self._replies)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except StopIteration:
            raise SidecarError("the sidecar ended the stream") from None

    def close(self) -> None:
        self._queue.put(None)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Session(_Stream):
    """One decoding loop's sequence kept by the sidecar. A refused step raises and leaves the
    session as it was."""

    def __init__(self, sidecar):
        super().__init__(sidecar.stub.Session, sidecar.metadata)
        self.session_id: Optional[int] = None

    def _step(self, **step) -> pb.SessionResponse:
        reply = self._send(pb.SessionRequest(**step))
        if reply.HasField("error"):
            raise from_step_error(reply.error)
        return reply

    def start(self, context: Sequence[int], use_model: bool = False, namespace: str = "",
              learn: bool = False, reference: Sequence[int] = ()) -> pb.SessionState:
        reply = self._step(start=pb.SessionStart(context=list(context), use_model=use_model,
                                                 namespace=namespace, learn=learn,
                                                 reference=list(reference)))
        self.session_id = reply.state.session_id
        return reply.state

    def append(self, tokens: Sequence[int]) -> pb.SessionState:
        return self._step(append=pb.SessionAppend(tokens=list(tokens))).state

    def truncate(self, length: int) -> pb.SessionState:
        return self._step(truncate=pb.SessionTruncate(length=length)).state

    def mix(self, *, logits=None, top_k_logprobs: Optional[pb.NeuralTopK] = None, own_model: bool = False,
            rule: Rule = None, top_k: int = 8, max_match: int = 0) -> pb.MixResponse:
        mix = pb.SessionMix(top_k=top_k, max_match=max_match,
                            **neural_fields(logits, top_k_logprobs, own_model), **lambda_rule(rule))
        return self._step(mix=mix).mix

    def draft(self, options: Optional[pb.DraftOptions] = None) -> pb.DraftResponse:
        return self._step(draft=options or draft_options()).draft


class Batch(_Stream):
    """An inference engine's batch: `step` sends every sequence's part of one engine step and returns
    their answers in order. Sequences join with `start` and leave with `finish`; the others keep
    their state between steps."""

    def __init__(self, sidecar):
        super().__init__(sidecar.stub.Batch, sidecar.metadata)

    @staticmethod
    def part(id: int, *, start: Optional[Sequence[int]] = None, use_model: bool = False,
             namespace: str = "", learn: bool = False, keep: Optional[int] = None,
             append: Sequence[int] = (), mix: Optional[pb.SessionMix] = None,
             draft: Optional[pb.DraftOptions] = None, finish: bool = False) -> pb.SequenceStep:
        """One sequence's part of a step: start (its context), keep (take tokens back), append,
        then a mix and/or a draft, then finish."""
        fields = {}
        if start is not None:
            fields["start"] = pb.SessionStart(context=list(start), use_model=use_model,
                                              namespace=namespace, learn=learn)
        if keep is not None:
            fields["keep"] = keep
        if mix is not None:
            fields["mix"] = mix
        if draft is not None:
            fields["draft"] = draft
        return pb.SequenceStep(id=id, append=list(append), finish=finish, **fields)

    @staticmethod
    def mix_request(*, logits=None, top_k_logprobs: Optional[pb.NeuralTopK] = None,
                    own_model: bool = False, rule: Rule = None, top_k: int = 8,
                    max_match: int = 0) -> pb.SessionMix:
        return pb.SessionMix(top_k=top_k, max_match=max_match,
                             **neural_fields(logits, top_k_logprobs, own_model), **lambda_rule(rule))

    def step(self, parts: Iterable[pb.SequenceStep], check: bool = True) -> list[pb.SequenceResult]:
        """Runs one engine step. With `check`, a refused part raises its error (naming the sequence)
        after the whole step was done; without, each result's `error` says."""
        results = list(self._send(pb.BatchStep(sequences=list(parts))).sequences)
        if check:
            for r in results:
                if r.HasField("error"):
                    err = from_step_error(r.error)
                    raise type(err)(f"sequence {r.id}: {err.details}")
        return results
