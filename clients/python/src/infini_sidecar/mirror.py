"""An engine's sequences mirrored in one sidecar `Batch` stream: the engines' integrations
(`infini_sidecar.llama_cpp`, `infini_sidecar.vllm`) keep each running sequence's tokens in step with
the sidecar's copy, so an engine step is one message whatever the batch: each sequence sends only
the tokens after the longest prefix the sidecar already has (taking back what the engine rejected)
with its request (a mix, a draft).

A part the sidecar refuses starts its sequence afresh at the next step, as a refused part may have
done some of its work (a `keep` before a refused `append`). A step that ends the stream (a timeout,
the sidecar gone) raises and forgets every sequence; the next step opens a new stream.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Optional, Sequence

from . import sidecar_pb2 as pb
from .client import Sidecar
from .errors import SidecarError
from .streams import Batch


@dataclass
class Row:
    """One sequence's part of an engine step: its tokens now, and what it asks."""
    key: Hashable
    tokens: Sequence[int]
    mix: Optional[pb.SessionMix] = None
    draft: Optional[pb.DraftOptions] = None
    #: How the sequence starts in the sidecar, when it is new to it.
    namespace: str = ""
    learn: bool = False


@dataclass
class _Mirrored:
    id: int
    #: The tokens the sidecar holds; None after a refusal (started afresh at the next step).
    tokens: Optional[list[int]] = field(default=None)


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix, by slices compared in C (sequences are thousands of
    tokens, and this runs for every sequence at every engine step): whole when one extends the other,
    the usual case, else by bisection."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def as_list(tokens: Sequence[int]) -> list[int]:
    """Token ids as a list of Python ints (a NumPy array converted in C)."""
    return tokens.tolist() if hasattr(tokens, "tolist") else [int(t) for t in tokens]


class MirroredBatch:
    def __init__(self, sidecar: Sidecar):
        self.sidecar = sidecar
        self.batch: Optional[Batch] = None
        self.sequences: dict[Hashable, _Mirrored] = {}
        self.next_id = 1

    def tokens(self, key: Hashable) -> Optional[list[int]]:
        """The tokens the sidecar holds for `key`, if it holds the sequence."""
        held = self.sequences.get(key)
        return None if held is None else held.tokens

    def step(self, rows: Sequence[Row], finished: Sequence[Hashable] = ()) -> list[pb.SequenceResult]:
        """One engine step: each row's catch-up and request, and the `finished` sequences leave, in
        one message. Returns each row's result, in order; a refused row's result carries `error`."""
        if self.batch is None:
            self.batch, self.sequences = self.sidecar.batch(), {}
        parts: list[pb.SequenceStep] = []
        for key in finished:
            held = self.sequences.pop(key, None)
            if held is not None:
                parts.append(Batch.part(held.id, finish=True))
        at = []
        for row in rows:
            ids = as_list(row.tokens)
            held = self.sequences.get(row.key)
            if held is not None and held.tokens is not None and ids[:1] == held.tokens[:1]:
                common = common_prefix(ids, held.tokens)
                keep = common if common < len(held.tokens) else None
                parts.append(Batch.part(held.id, keep=keep, append=ids[common:], mix=row.mix,
                                        draft=row.draft))
            else:
                # New, refused before, or another prompt: the old sequence leaves (if a refused
                # start never opened it, its finish is refused, which changes nothing).
                if held is not None:
                    parts.append(Batch.part(held.id, finish=True))
                held = _Mirrored(self.next_id)
                self.next_id += 1
                self.sequences[row.key] = held
                parts.append(Batch.part(held.id, start=ids, namespace=row.namespace, learn=row.learn,
                                        mix=row.mix, draft=row.draft))
            held.tokens = ids
            at.append(len(parts) - 1)
        if not parts:
            return []
        try:
            # Unchecked: each row's refusal is its own (its result's `error`).
            results = self.batch.step(parts, check=False)
        except SidecarError:
            self.close()
            raise
        answers = [results[i] for i in at]
        for row, result in zip(rows, answers):
            if result.HasField("error"):
                self.sequences[row.key].tokens = None
        return answers

    def close(self) -> None:
        if self.batch is not None:
            self.batch.close()
            self.batch = None
        self.sequences = {}
