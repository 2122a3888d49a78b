"""The Python client of infini-sidecar (gRPC API `sidecar.v1`).

    from infini_sidecar import Sidecar
    sidecar = Sidecar("127.0.0.1:50051")
    ids = sidecar.tokenize("The kernel uses a")
    dist = sidecar.next_token_distribution(ids)

Every RPC is a method of `Sidecar`; `Sidecar.session()` and `Sidecar.batch()` open the two decoding
streams. Refusals raise `SidecarError` subclasses named after their gRPC status. The adapters for
llama.cpp (`infini_sidecar.llama_cpp`) and lm-evaluation-harness (`infini_sidecar.lm_eval`) are
imported on their own, as they need those packages.
"""
from . import sidecar_pb2 as pb
from .client import Sidecar, lambda_rule, top_k_logprobs
from .errors import (BatchStepError, DeadlineExceeded, FailedPrecondition, InvalidArgument,
                     NotFound, ResourceExhausted, SidecarError, Unauthenticated, Unavailable)
from .streams import Batch, Session

__version__ = "1.0.0"
#: The API this client speaks: the proto package its stubs were generated from.
API = "sidecar.v1"

__all__ = ["API", "Batch", "BatchStepError", "DeadlineExceeded", "FailedPrecondition",
           "InvalidArgument", "NotFound", "ResourceExhausted", "Session", "Sidecar", "SidecarError",
           "Unauthenticated", "Unavailable", "lambda_rule", "pb", "top_k_logprobs"]
