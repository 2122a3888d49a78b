"""The exceptions of the client: one class per gRPC status the sidecar answers with, raised for a
refused call and for a refused step of a Session or Batch stream alike; and `BatchStepError`, a Batch
step some of whose parts were refused."""
from __future__ import annotations

import grpc


class SidecarError(Exception):
    """A call or step the sidecar refused; `code` is the gRPC status code, `details` its message."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None):
        super().__init__(f"{(code or self.code).name}: {details}")
        self.details = details
        if code is not None:
            self.code = code


class InvalidArgument(SidecarError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(SidecarError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(SidecarError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(SidecarError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(SidecarError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(SidecarError):
    code = grpc.StatusCode.UNAVAILABLE


class Unauthenticated(SidecarError):
    code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE = {cls.code: cls for cls in [InvalidArgument, NotFound, FailedPrecondition, ResourceExhausted,
                                      DeadlineExceeded, Unavailable, Unauthenticated]}


def from_code(code: grpc.StatusCode, details: str) -> SidecarError:
    cls = _BY_CODE.get(code)
    return cls(details) if cls else SidecarError(details, code)


def from_rpc_error(error: grpc.RpcError) -> SidecarError:
    return from_code(error.code(), error.details() or "")


def from_step_error(error) -> SidecarError:
    """A `StepError` of a stream's answer (its code is the status code's number)."""
    code = next((c for c in grpc.StatusCode if c.value[0] == error.code), grpc.StatusCode.UNKNOWN)
    return from_code(code, error.message)


class BatchStepError(SidecarError):
    """A `Batch` step with refused parts, raised after the step was done: the other parts took effect.
    `results` holds every part's result in order (a refused one with its `error`, and its sequence's
    `state` after the step); `errors` the same order, each refusal as its typed exception and None
    for a part that was done. `code` is the first refusal's."""

    def __init__(self, results):
        self.results = results
        self.errors = [from_step_error(r.error) if r.HasField("error") else None for r in results]
        refused = [(r.id, e) for r, e in zip(results, self.errors) if e is not None]
        said = "; ".join(f"sequence {id}: {e}" for id, e in refused)
        super().__init__(f"{len(refused)} of {len(results)} parts refused: {said}", refused[0][1].code)
