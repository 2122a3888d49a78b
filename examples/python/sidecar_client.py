"""A small Python client of the infini-sidecar gRPC API (sidecar.v1).

The stubs are generated from proto/sidecar/v1/sidecar.proto with grpcio-tools the first time they are
needed, into a folder beside this file's cache, so they always match the proto of this checkout.

    pip install grpcio grpcio-tools
"""
import importlib
import os
import queue
import sys
import tempfile
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "proto"
PROTO = PROTO_ROOT / "sidecar" / "v1" / "sidecar.proto"


def load_stubs():
    """Returns the generated (messages, services) modules, generating them when the proto changed."""
    from grpc_tools import protoc

    out = Path(os.environ.get("SIDECAR_PY_STUBS", Path(tempfile.gettempdir()) / "sidecar-py-stubs"))
    stamp = out / "proto.mtime"
    mtime = str(PROTO.stat().st_mtime_ns)
    if not stamp.exists() or stamp.read_text() != mtime:
        out.mkdir(parents=True, exist_ok=True)
        args = ["protoc", f"-I{PROTO_ROOT}", f"--python_out={out}", f"--grpc_python_out={out}", str(PROTO)]
        if protoc.main(args) != 0:
            raise RuntimeError(f"grpc_tools.protoc failed on {PROTO}")
        stamp.write_text(mtime)
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return (
        importlib.import_module("sidecar.v1.sidecar_pb2"),
        importlib.import_module("sidecar.v1.sidecar_pb2_grpc"),
    )


pb, pb_grpc = load_stubs()


class Sidecar:
    """A connection to one sidecar; `token` is the bearer token when the sidecar asks for one."""

    def __init__(self, addr, token=None):
        self.channel = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.SidecarStub(self.channel)
        self.metadata = [("authorization", f"Bearer {token}")] if token else []

    def info(self):
        return self.stub.Info(pb.InfoRequest(), metadata=self.metadata)

    def tokenize(self, text):
        return list(self.stub.Tokenize(pb.TokenizeRequest(text=text), metadata=self.metadata).ids)

    def score(self, documents, per_token=False, **lambda_rule):
        """Streams ScoreResponse items for (token_ids, domain) pairs; `lambda_rule` is one of
        fixed_lambda=λ, split=True, gate=True, adaptive=True (none: the mixing file's default)."""
        request = pb.ScoreRequest(
            documents=[pb.ScoreDocument(token_ids=ids, domain=domain) for ids, domain in documents],
            per_token=per_token,
            **lambda_rule,
        )
        yield from self.stub.Score(request, metadata=self.metadata)

    def session(self):
        return Session(self)


class Session:
    """A decoding loop's sequence kept by the sidecar: each call is one step of the bidirectional
    Session stream, answered in order."""

    def __init__(self, sidecar):
        self._queue = queue.Queue()
        self._replies = sidecar.stub.Session(iter(self._queue.get, None), metadata=sidecar.metadata)

    def _step(self, **step):
        self._queue.put(pb.SessionRequest(**step))
        reply = next(self._replies)
        if reply.HasField("error"):
            raise ValueError(f"step refused ({reply.error.code}): {reply.error.message}")
        return reply

    def start(self, context, use_model=False):
        return self._step(start=pb.SessionStart(context=context, use_model=use_model))

    def append(self, tokens):
        return self._step(append=pb.SessionAppend(tokens=tokens))

    def truncate(self, length):
        return self._step(truncate=pb.SessionTruncate(length=length))

    def mix_top_k(self, tokens, logprobs, rest_mass, top_k=8, **lambda_rule):
        neural = pb.NeuralTopK(tokens=tokens, logprobs=logprobs, rest_mass=rest_mass)
        return self._step(mix=pb.SessionMix(top_k_logprobs=neural, top_k=top_k, **lambda_rule)).mix

    def close(self):
        self._queue.put(None)
