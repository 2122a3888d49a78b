"""The two decoding streams: `Session` (one sequence, one step a message) and `Batch` (an engine's
whole batch, one engine step a message). Each call sends one message and waits for its answer."""
from __future__ import annotations

import queue
import threading
from typing import Iterable, Optional, Sequence

import grpc

from . import sidecar_pb2 as pb
from .client import Rule, draft_options, lambda_rule, neural_fields
from .errors import (BatchStepError, DeadlineExceeded, SidecarError, from_code, from_rpc_error,
                     from_step_error)


class _Stream:
    """A bidirectional stream driven one message at a time; closed with `close()` or `with`.

    A step waits at most the client's `timeout` (seconds; None: no limit) for its answer. One that
    gets none raises `DeadlineExceeded` and cancels the stream, as whether the sidecar did the step
    is then unknown: open a new stream (and start its sequences again) to go on. Once the stream has
    ended (a timeout, an RPC error, the sidecar ending it, `close()`), every step raises at once."""

    def __init__(self, method, sidecar):
        self._requests: queue.Queue = queue.Queue()
        self._call = method(iter(self._requests.get, None), metadata=sidecar.metadata)
        self._timeout = sidecar.timeout
        # The answers, moved by a thread of their own so a step can stop waiting; the last item is
        # the error that ended the stream.
        self._replies: queue.Queue = queue.Queue()
        self._ended: Optional[SidecarError] = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for reply in self._call:
                self._replies.put(reply)
            self._replies.put(SidecarError("the sidecar ended the stream"))
        except grpc.RpcError as e:
            self._replies.put(from_rpc_error(e))

    def _send(self, message):
        if self._ended is not None:
            raise from_code(self._ended.code, f"the stream has ended: {self._ended.details}")
        self._requests.put(message)
        try:
            reply = self._replies.get(timeout=self._timeout)
        except queue.Empty:
            self._call.cancel()
            reply = DeadlineExceeded(f"no answer within {self._timeout} s; the stream is cancelled")
        if isinstance(reply, SidecarError):
            self._ended = reply
            self._requests.put(None)  # frees gRPC's thread that waits for the next request
            raise reply
        return reply

    def close(self) -> None:
        self._requests.put(None)
        if self._ended is None:
            self._ended = SidecarError("the stream was closed", grpc.StatusCode.CANCELLED)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Session(_Stream):
    """One decoding loop's sequence kept by the sidecar. A refused step raises and leaves the
    session as it was."""

    def __init__(self, sidecar):
        super().__init__(sidecar.stub.Session, sidecar)
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
        super().__init__(sidecar.stub.Batch, sidecar)

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
        """Runs one engine step; its results, one per part in order. The parts are independent: a
        refused part (its result's `error` says why, its `state` what the sequence is now) changes
        nothing of the others, which the sidecar did. With `check`, a step with a refused part raises
        `BatchStepError`, which carries every result (`results`) and each refusal as an exception
        (`errors`, in the same order); without, the results come back and the caller looks at each
        `error`. Sending the step again would do the parts that were done twice."""
        results = list(self._send(pb.BatchStep(sequences=list(parts))).sequences)
        if check and any(r.HasField("error") for r in results):
            raise BatchStepError(results)
        return results
