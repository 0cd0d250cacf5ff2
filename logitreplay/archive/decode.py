"""Decode cases: the facts of one decode top-k call, stated once for the archive, adapters and replay.

Every generated token runs the indexer's decode top-k in every DSA layer. In vLLM 0.33 that is
`SparseIndexerTopk.forward(logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len)`
(`model_executor/layers/indexer_topk.py`): `logits` is (batch * next_n, max_model_len) with each row far
shorter than the width and the cells past its end left uninitialized; `seq_lens` is int32 (batch, 1), or
(batch, next_n) of per-row lengths for native speculative decode (MTP); `max_seq_len` is a host-side bound
(the uncompressed maximum, so for V4 it may exceed every row). Row r of request b = r // next_n ends at
`seq_lens[b] - next_n + 1 + r % next_n`, clamped at 0, for the (batch, 1) form, and at `seq_lens[b, r % next_n]`
for the per-row form (`SparseIndexerTopk._row_ends`).

A decode case is stored in the ordinary ragged format (every row starts at 0 and ends as above); its
attributes add `kind: "decode"` and a `decode` object holding `DecodeFacts`, so a replay can call a decode
kernel with its own arguments. A case without `kind` is a prefill case: its stored bytes are what they
always were. `check_decode` refuses a case whose rows do not match its facts, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from logitreplay.errors import ArchiveError

KINDS = ("prefill", "decode")


@dataclass(frozen=True)
class DecodeFacts:
    """What one decode top-k call got besides the logits (field names as stored in `attrs["decode"]`).

    `seq_lens` is the exact int32 tensor of the call as nested lists, (batch, 1) or (batch, next_n);
    `max_model_len` the logits width (the case's `cols`); `backend` the top-k backend that ran
    (`persistent`, `cooperative`, ..., or what selected in another engine; None for synthetic cases);
    `speculative` whether the step verified draft tokens."""

    batch: int
    next_n: int
    seq_lens: tuple[tuple[int, ...], ...]
    max_seq_len: int
    max_model_len: int
    backend: str | None = None
    speculative: bool = False

    @property
    def rows(self) -> int:
        return self.batch * self.next_n

    def seq_lens_array(self) -> np.ndarray:
        """`seq_lens` as the int32 (batch, 1 or next_n) array the kernel got."""
        return np.asarray(self.seq_lens, dtype=np.int32).reshape(self.batch, -1)

    def row_ends(self) -> np.ndarray:
        """The exclusive end of every row, as vLLM derives it from `seq_lens` and `next_n`."""
        return row_ends(self.seq_lens_array(), self.next_n)

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "next_n": self.next_n, "seq_lens": [list(r) for r in self.seq_lens],
                "max_seq_len": self.max_seq_len, "max_model_len": self.max_model_len, "backend": self.backend,
                "speculative": self.speculative}

    def describe(self) -> str:
        """Short, for tables and grouping: `decode b64 n1 ctx 2K-128K` (batch, next_n, row-length span)."""
        ends = self.row_ends()
        span = f"{_tokens(int(ends.min()))}-{_tokens(int(ends.max()))}" if ends.size else "-"
        return f"decode b{self.batch} n{self.next_n} ctx {span}"

    @classmethod
    def from_row_ends(cls, ends: np.ndarray, *, next_n: int, per_row: bool, max_model_len: int,
                      max_seq_len: int | None = None, backend: str | None = None,
                      speculative: bool = False) -> DecodeFacts:
        """The facts of a call known on the host only as row ends (a capture reads the bounds off the
        model's thread): `per_row` gives (batch, next_n) `seq_lens`, else (batch, 1), whose value is the
        last row's end of each request (it is the unclamped one). `max_seq_len` defaults to the longest row."""
        e = np.asarray(ends, dtype=np.int64).reshape(-1, next_n)
        lens = e if per_row else e[:, -1:]
        return cls(int(e.shape[0]), int(next_n), tuple(tuple(int(v) for v in r) for r in lens),
                   int(max_seq_len if max_seq_len is not None else (e.max() if e.size else 0)),
                   int(max_model_len), backend, bool(speculative))


def row_ends(seq_lens: np.ndarray, next_n: int) -> np.ndarray:
    """Row ends from a (batch, 1) or (batch, next_n) `seq_lens` (`SparseIndexerTopk._row_ends`)."""
    lens = np.asarray(seq_lens, dtype=np.int64)
    if lens.ndim != 2 or lens.shape[1] not in (1, next_n):
        raise ValueError(f"seq_lens of shape {lens.shape} for next_n {next_n}: expected (batch, 1) or "
                         f"(batch, {next_n})")
    if lens.shape[1] == next_n:
        return lens.reshape(-1).astype(np.int32)
    ends = lens - next_n + 1 + np.arange(next_n, dtype=np.int64)[None, :]
    return np.maximum(ends, 0).reshape(-1).astype(np.int32)


def kind_of(attrs: dict[str, Any]) -> str:
    """A case's kind: "decode" when its attributes say so, else "prefill" (every case before decode)."""
    kind = attrs.get("kind", "prefill")
    return kind if isinstance(kind, str) else repr(kind)


def decode_facts(case_id: str, attrs: dict[str, Any]) -> DecodeFacts | None:
    """The decode facts of a case's attributes (None for a prefill case); `ArchiveError` naming the field
    when they are malformed."""
    if kind_of(attrs) != "decode":
        return None
    d = attrs.get("decode")
    if not isinstance(d, dict):
        raise _bad(case_id, "decode", "missing or not a JSON object (the case's kind is decode)")
    ints = {}
    for key, low in (("batch", 1), ("next_n", 1), ("max_seq_len", 0), ("max_model_len", 0)):
        v = d.get(key)
        if type(v) is not int or v < low:
            raise _bad(case_id, f"decode.{key}", f"expected an integer >= {low}, got {v!r}")
        ints[key] = v
    lens = d.get("seq_lens")
    width = (1, ints["next_n"])
    if isinstance(lens, list) and lens and len(lens) != ints["batch"]:
        raise _bad(case_id, "decode.batch", f"{ints['batch']}, but seq_lens holds {len(lens)} requests")
    if (not isinstance(lens, list) or len(lens) != ints["batch"]
            or any(not isinstance(r, list) or len(r) != len(lens[0]) for r in lens) or len(lens[0]) not in width
            or any(type(v) is not int or v < 0 for r in lens for v in r)):
        raise _bad(case_id, "decode.seq_lens", f"expected {ints['batch']} lists of {' or '.join(map(str, set(width)))}"
                                               " integers >= 0 (batch x 1, or batch x next_n)")
    backend, speculative = d.get("backend"), d.get("speculative")
    if backend is not None and not isinstance(backend, str):
        raise _bad(case_id, "decode.backend", f"expected a string or null, got {backend!r}")
    if not isinstance(speculative, bool):
        raise _bad(case_id, "decode.speculative", f"expected true or false, got {speculative!r}")
    return DecodeFacts(ints["batch"], ints["next_n"], tuple(tuple(r) for r in lens), ints["max_seq_len"],
                       ints["max_model_len"], backend, speculative)


def check_decode(case_id: str, attrs: dict[str, Any], row_starts: np.ndarray, row_ends_: np.ndarray, cols: int) -> None:
    """Raise `ArchiveError` (one line, naming the field) unless the case's kind is known and, for a decode
    case, its rows are exactly those its facts describe."""
    kind = kind_of(attrs)
    if kind not in KINDS:
        raise _bad(case_id, "kind", f"{kind!r} is not one of {', '.join(KINDS)}")
    f = decode_facts(case_id, attrs)
    if f is None:
        return
    if f.rows != row_ends_.shape[0]:
        raise _bad(case_id, "decode.batch", f"batch {f.batch} x next_n {f.next_n} = {f.rows} rows, "
                                            f"the case has {row_ends_.shape[0]}")
    if f.max_model_len != cols:
        raise _bad(case_id, "decode.max_model_len", f"{f.max_model_len}, but the logits are {cols} wide")
    if row_starts.any():
        r = int(np.argmax(row_starts != 0))
        raise _bad(case_id, "row_starts", f"row {r} starts at {int(row_starts[r])}; every decode row starts at 0")
    want = f.row_ends()
    if not np.array_equal(want, row_ends_):
        r = int(np.argmax(want != row_ends_))
        raise _bad(case_id, "decode.seq_lens", f"give row {r} the end {int(want[r])}, the case's row_ends "
                                               f"say {int(row_ends_[r])}")
    longest = int(want.max()) if want.size else 0
    if f.max_seq_len < longest:
        raise _bad(case_id, "decode.max_seq_len", f"{f.max_seq_len} is below the longest row ({longest})")


def _tokens(n: int) -> str:
    return f"{round(n / 1024)}K" if n >= 1024 else str(n)


def _bad(case_id: str, field: str, why: str) -> ArchiveError:
    return ArchiveError(f"case {case_id}: field {field}: {why}")


def capture_rows(attrs: dict[str, Any], starts: np.ndarray, ends: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """The host half of a decode capture (a writer thread, once the bounds are off the device): the rows
    rebased to start at column 0, and `attrs["decode"]` completed from the row ends.

    A capture states on the model's thread what the shapes tell (`next_n`, `max_model_len`, `backend`,
    `speculative`, and `per_row`: whether the call's `seq_lens` was (batch, next_n)); `seq_lens`, and
    `max_seq_len` unless stated, come from the ends here. Rebasing changes no selection: indices are
    relative to the row start and the ragged values are the same cells; a left-padded request of a
    transformers batch then reads as it would from vLLM's paged cache, its keys from column 0."""
    d = dict(attrs["decode"])
    lengths = (np.asarray(ends, dtype=np.int64) - np.asarray(starts, dtype=np.int64)).astype(np.int32)
    facts = DecodeFacts.from_row_ends(lengths, next_n=int(d["next_n"]), per_row=bool(d.get("per_row")),
                                      max_model_len=int(d["max_model_len"]), max_seq_len=d.get("max_seq_len"),
                                      backend=d.get("backend"), speculative=bool(d.get("speculative")))
    return np.zeros_like(lengths), lengths, {**attrs, "kind": "decode", "decode": facts.to_json()}
