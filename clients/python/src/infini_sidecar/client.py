"""`Sidecar`: one connection to a sidecar, with a typed method for every unary and server-streaming
RPC, and the two decoding streams (`session`, `batch`)."""
from __future__ import annotations

import math
from typing import Iterable, Iterator, Optional, Sequence, Union

import grpc

from . import sidecar_pb2 as pb
from . import sidecar_pb2_grpc as pb_grpc
from .errors import from_rpc_error

#: A λ rule: None (the mixing file's default), "split" (λ1/λ2), "gate", "adaptive", or a fixed λ.
Rule = Union[None, str, float]

DRAFT_SOURCES = {"all": pb.DRAFT_SOURCE_ALL, "index": pb.DRAFT_SOURCE_INDEX,
                 "prompt": pb.DRAFT_SOURCE_PROMPT, "live": pb.DRAFT_SOURCE_LIVE,
                 "reference": pb.DRAFT_SOURCE_REFERENCE}


def lambda_rule(rule: Rule) -> dict:
    """The `lambda` oneof fields of a request for `rule`."""
    if rule is None or rule == "default":
        return {}
    if isinstance(rule, (int, float)) and not isinstance(rule, bool):
        return {"fixed_lambda": float(rule)}
    if rule in ("split", "gate", "adaptive"):
        return {rule: True}
    raise ValueError(f"unknown λ rule {rule!r}: None, 'split', 'gate', 'adaptive' or a number")


def top_k_logprobs(tokens: Sequence[int], logprobs: Sequence[float],
                   rest_mass: Optional[float] = None) -> pb.NeuralTopK:
    """A caller's top-k log-probs; `rest_mass` (the other tokens' probability) defaults to what the
    top-k leave."""
    if rest_mass is None:
        rest_mass = max(0.0, 1.0 - sum(math.exp(l) for l in logprobs))
    return pb.NeuralTopK(tokens=list(tokens), logprobs=list(logprobs), rest_mass=rest_mass)


def neural_fields(logits=None, top_k: Optional[pb.NeuralTopK] = None, own_model: bool = False) -> dict:
    """The `neural` oneof fields: full logits, top-k log-probs, or the sidecar's own model."""
    given = [logits is not None, top_k is not None, own_model]
    if sum(given) != 1:
        raise ValueError("give exactly one of logits, top_k (top_k_logprobs) and own_model")
    if logits is not None:
        return {"logits": pb.NeuralLogits(logits=list(map(float, logits)))}
    if top_k is not None:
        return {"top_k_logprobs": top_k}
    return {"own_model": True}


def mixed_log_probs(mixed: pb.MixResponse, logprobs) -> tuple[list[int], list[float], float]:
    """What an engine's log-probs over its whole vocabulary (`logprobs`: a NumPy array or a torch
    tensor) become under a mix: the tokens of `mixed.top`, their mixed log-probs, and the log-factor
    to add to every other token's. The mix returns its top tokens exactly and the total of the
    rest, which is (1 − λ) times the engine's mass there plus λ times the ∞-gram's mass beyond the
    top. That last part is spread as the engine's probabilities are (the ∞-gram's own beyond its top
    is not sent), so the top tokens keep exactly the mix's probabilities once the engine normalizes.
    The factor is -inf when nothing is left for the others."""
    tokens = [e.token for e in mixed.top]
    values = [math.log(e.prob) if e.prob > 0 else -math.inf for e in mixed.top]
    rest = max(0.0, 1.0 - sum(e.prob for e in mixed.top))
    neural_rest = 1.0 - math.fsum(math.exp(x) for x in logprobs[tokens].tolist())
    if rest <= 0.0 or neural_rest <= 0.0:
        return tokens, values, -math.inf
    return tokens, values, math.log(rest) - math.log(neural_rest)


def draft_options(max_tokens: int = 8, tree_budget: int = 0, source: str = "all",
                  min_token_prob: Optional[float] = None, min_path_prob: Optional[float] = None,
                  match_len_factor: Optional[float] = None) -> pb.DraftOptions:
    """Draft options: a chain (tree_budget 0) or a tree of at most tree_budget nodes."""
    optional = {k: v for k, v in [("min_token_prob", min_token_prob), ("min_path_prob", min_path_prob),
                                  ("match_len_factor", match_len_factor)] if v is not None}
    return pb.DraftOptions(max_tokens=max_tokens, tree_budget=tree_budget, source=DRAFT_SOURCES[source],
                           **optional)


class Sidecar:
    """A connection to one sidecar at `addr` (host:port); `token` is the bearer token when the
    sidecar asks for one; `timeout` (seconds) is every unary call's deadline and the longest a
    stream's step waits for its answer (see `Session` and `Batch`)."""

    def __init__(self, addr: str = "127.0.0.1:50051", token: Optional[str] = None,
                 timeout: Optional[float] = None):
        self.channel = grpc.insecure_channel(addr, options=[
            ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)])
        self.stub = pb_grpc.SidecarStub(self.channel)
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Sidecar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request):
        try:
            return method(request, metadata=self.metadata, timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def info(self) -> pb.InfoResponse:
        return self._call(self.stub.Info, pb.InfoRequest())

    def tokenize(self, text: str) -> list[int]:
        return list(self._call(self.stub.Tokenize, pb.TokenizeRequest(text=text)).ids)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self._call(self.stub.Detokenize, pb.DetokenizeRequest(ids=list(ids))).text

    def count(self, ids: Sequence[int]) -> int:
        return self._call(self.stub.Count, pb.CountRequest(ids=list(ids))).count

    def next_token_distribution(self, prompt: Sequence[int], infinite: bool = True,
                                max_support: int = 0) -> pb.NextTokenDistributionResponse:
        request = pb.NextTokenDistributionRequest(prompt=list(prompt), infinite=infinite,
                                                  max_support=max_support)
        return self._call(self.stub.NextTokenDistribution, request)

    def search_documents(self, cnf: Sequence[Sequence[Sequence[int]]], maxnum: int = 1,
                         max_disp_len: int = 0, max_clause_freq: int = 0) -> pb.SearchDocumentsResponse:
        """Documents matching a CNF: a list of clauses (AND), each a list of n-grams (OR)."""
        clauses = [pb.Clause(ngrams=[pb.NGram(ids=list(g)) for g in clause]) for clause in cnf]
        request = pb.SearchDocumentsRequest(cnf=clauses, maxnum=maxnum, max_disp_len=max_disp_len,
                                            max_clause_freq=max_clause_freq)
        return self._call(self.stub.SearchDocuments, request)

    def generate(self, prompt: Sequence[int], max_new_tokens: int, *, levels: Optional[int] = None,
                 decay: float = 0.0, weigh_distributions: bool = False, temperature: float = 1.0,
                 seed: int = 0) -> pb.GenerateResponse:
        """The ∞-gram alone as a language model (selective back-off): `levels` k (None: 2, 0: every
        level), weights decay^i (0: 0.1), drawn at `temperature` (0: the most likely token)."""
        request = pb.GenerateRequest(prompt=list(prompt), max_new_tokens=max_new_tokens, decay=decay,
                                     weigh_distributions=weigh_distributions, temperature=temperature,
                                     seed=seed)
        if levels is not None:
            request.levels = levels
        return self._call(self.stub.Generate, request)

    def trace(self, ids: Sequence[int] = (), text: str = "", min_len: int = 0, maxnum: int = 0,
              max_disp_len: int = 0) -> pb.TraceResponse:
        """Maximal matching spans of `ids` (or of `text`, encoded with the index's tokenizer) that occur
        verbatim in the reference data, with their counts and documents."""
        request = pb.TraceRequest(ids=list(ids), text=text, min_len=min_len, maxnum=maxnum,
                                  max_disp_len=max_disp_len)
        return self._call(self.stub.Trace, request)

    def hints(self, sequences: Iterable[Sequence[int]], samples: int = 0, exact: bool = False,
              keep_own_copies: bool = False, min_plateau: int = 0, seed: int = 0) -> pb.HintsResponse:
        """∞-gram hints for training: for every position of each sequence, `samples` next tokens (20 by
        default; the exact top ones with counts when `exact`) and the suffix they come from, the
        sequences' own copies in the index left out unless `keep_own_copies`."""
        request = pb.HintsRequest(sequences=[pb.TokenIds(ids=list(s)) for s in sequences],
                                  samples=samples, exact=exact, keep_own_copies=keep_own_copies,
                                  min_plateau=min_plateau, seed=seed)
        return self._call(self.stub.Hints, request)

    def mix(self, context: Sequence[int], *, logits=None, top_k_logprobs: Optional[pb.NeuralTopK] = None,
            own_model: bool = False, rule: Rule = None, top_k: int = 8, sequence_id: str = "",
            max_match: int = 0) -> pb.MixResponse:
        """λ·P∞ + (1−λ)·P_neural after `context`, the neural side given one of three ways."""
        request = pb.MixRequest(context=list(context), top_k=top_k, sequence_id=sequence_id,
                                max_match=max_match, **neural_fields(logits, top_k_logprobs, own_model),
                                **lambda_rule(rule))
        return self._call(self.stub.Mix, request)

    def score(self, documents: Iterable[Union[Sequence[int], tuple]], per_token: bool = False,
              rule: Rule = None) -> Iterator[pb.ScoreResponse]:
        """Streams one `ScoreResponse` per document (token ids, or (token ids, domain) pairs), then the
        totals; scored by the sidecar's own model with the evaluator's window protocol."""
        docs = []
        for d in documents:
            ids, domain = d if isinstance(d, tuple) else (d, "")
            docs.append(pb.ScoreDocument(token_ids=list(ids), domain=domain))
        request = pb.ScoreRequest(documents=docs, per_token=per_token, **lambda_rule(rule))
        try:
            yield from self.stub.Score(request, metadata=self.metadata, timeout=self.timeout)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def draft(self, context: Optional[Sequence[int]] = None, session_id: Optional[int] = None,
              options: Optional[pb.DraftOptions] = None, namespace: str = "",
              reference: Sequence[int] = ()) -> pb.DraftResponse:
        """A draft continuing `context`, or an open session's sequence (`session_id`)."""
        if (context is None) == (session_id is None):
            raise ValueError("give a context or a session_id")
        target = ({"session_id": session_id} if session_id is not None
                  else {"context": pb.TokenIds(ids=list(context))})
        request = pb.DraftRequest(options=options or draft_options(), namespace=namespace,
                                  reference=list(reference), **target)
        return self._call(self.stub.Draft, request)

    def add_documents(self, namespace: str, documents: Iterable[Union[str, Sequence[int]]],
                      request_id: str = "") -> pb.AddDocumentsResponse:
        """Adds documents (texts or token ids) to a namespace of the live index, all or none.

        A refused call added nothing. A call whose answer was lost (a timeout) may have been added:
        give a `request_id` (up to 128 bytes, unique per request) and send it again with the same id;
        the sidecar adds it once and answers the repeat with `repeated` set.
        """
        docs = [pb.LiveDocument(text=d) if isinstance(d, str) else pb.LiveDocument(tokens=pb.TokenIds(ids=list(d)))
                for d in documents]
        request = pb.AddDocumentsRequest(namespace=namespace, documents=docs, request_id=request_id)
        return self._call(self.stub.AddDocuments, request)

    def session(self) -> "Session":
        """A `Session` stream: one decoding loop's sequence kept by the sidecar."""
        from .streams import Session
        return Session(self)

    def batch(self) -> "Batch":
        """A `Batch` stream: an engine's whole batch, one message per engine step."""
        from .streams import Batch
        return Batch(self)
