"""The case: one top-k selection problem exactly as a kernel saw it, and its invariants.

Only the in-range part of each row is data (vLLM leaves the rest of the logits buffer uninitialized), so
values are kept ragged; `padded` rebuilds the source matrix with the recorded row stride and poisons
everything outside the bounds, so an out-of-bounds read is caught by verification.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from logitreplay.archive.decode import DecodeFacts, check_decode, decode_facts, kind_of
from logitreplay.archive.guards import check_memory
from logitreplay.errors import ArchiveError

DTYPES = ("float32", "bfloat16")
# What each logical dtype is stored as: numpy has no bfloat16, so its raw bits are kept as uint16.
STORAGE_DTYPE: dict[str, np.dtype[Any]] = {"float32": np.dtype("<f4"), "bfloat16": np.dtype("<u2")}
_TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Bytes of one logit of each logical dtype, as a kernel reads it.
ELEMENT_BYTES = {name: dt.itemsize for name, dt in STORAGE_DTYPE.items()}
CASE_ARRAYS = ("values", "offsets", "row_starts", "row_ends", "reference_indices")
MAX_INDEX = 2**31 - 1
# A top_k above the matrix width is real (a prompt shorter than vLLM's 2048), but only up to this: each
# selection slot costs output and expected-value memory per row whatever the data holds.
MAX_K_BEYOND_COLS = 1 << 16


@dataclass
class Case:
    """One selection problem: row r selects the `top_k` largest of `logits[r, row_starts[r]:row_ends[r]]`.

    `values` holds the in-range logits of every row concatenated (float32, or bfloat16 as raw uint16
    bits); row r is `values[offsets[r]:offsets[r + 1]]`. `attrs` is the JSON provenance (model and
    revision, engine, layer, chunk facts, synthetic recipe, ...).
    """

    case_id: str
    values: np.ndarray
    offsets: np.ndarray
    row_starts: np.ndarray
    row_ends: np.ndarray
    top_k: int
    cols: int
    row_stride: int
    dtype: str = "float32"
    reference_indices: np.ndarray | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.row_starts.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        return (self.row_ends.astype(np.int64) - self.row_starts.astype(np.int64))

    @property
    def kind(self) -> str:
        """`decode` for a decode top-k call (its facts in `decode`), else `prefill` (the default)."""
        return kind_of(self.attrs)

    @property
    def decode(self) -> DecodeFacts | None:
        """The decode facts (batch, next_n, seq_lens, ...) of a decode case; None for a prefill case."""
        return decode_facts(self.case_id, self.attrs)

    @property
    def nbytes(self) -> int:
        """Bytes of valid logits: what a selector must read at least once."""
        return int(self.values.nbytes)

    @classmethod
    def from_rows(
        cls,
        case_id: str,
        values: np.ndarray | torch.Tensor,
        row_starts: np.ndarray | torch.Tensor,
        row_ends: np.ndarray | torch.Tensor,
        *,
        top_k: int,
        cols: int,
        row_stride: int | None = None,
        reference_indices: np.ndarray | torch.Tensor | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Case:
        """Build a case from already-ragged values (as capture stages them); offsets are derived."""
        v = _to_numpy(values)
        dtype = _logical_dtype(values)
        starts = _to_numpy(row_starts).astype(np.int32)
        ends = _to_numpy(row_ends).astype(np.int32)
        offsets = np.zeros(starts.shape[0] + 1, dtype=np.int64)
        np.cumsum(ends.astype(np.int64) - starts.astype(np.int64), out=offsets[1:])
        ref = None if reference_indices is None else _to_numpy(reference_indices).astype(np.int32)
        case = cls(case_id, v.reshape(-1), offsets, starts, ends, int(top_k), int(cols),
                   int(row_stride if row_stride is not None else cols), dtype, ref, dict(attrs or {}))
        case.validate()
        return case

    @classmethod
    def from_matrix(
        cls,
        case_id: str,
        logits: np.ndarray | torch.Tensor,
        row_starts: np.ndarray | torch.Tensor,
        row_ends: np.ndarray | torch.Tensor,
        *,
        top_k: int,
        row_stride: int | None = None,
        reference_indices: np.ndarray | torch.Tensor | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Case:
        """Keep only the in-range cells of a (rows, cols) matrix; the rest is not data."""
        t = logits if isinstance(logits, torch.Tensor) else _numpy_to_torch(np.asarray(logits))
        if t.dim() != 2:
            raise ArchiveError(f"case {case_id}: field logits: expected a 2-D matrix, got shape {tuple(t.shape)}")
        starts = torch.as_tensor(_to_numpy(row_starts), dtype=torch.int64)
        ends = torch.as_tensor(_to_numpy(row_ends), dtype=torch.int64)
        _check_bounds(case_id, starts.numpy(), ends.numpy(), t.shape[1])
        values = gather_rows(t.detach().cpu(), starts, ends)
        stride = row_stride if row_stride is not None else (t.stride(0) if t.shape[0] > 1 else t.shape[1])
        return cls.from_rows(case_id, values, starts, ends, top_k=top_k, cols=t.shape[1], row_stride=stride,
                             reference_indices=reference_indices, attrs=attrs)

    def validate(self) -> None:
        """Raise `ArchiveError` naming the case and field unless every invariant of the format holds."""
        cid = self.case_id

        def bad(fieldname: str, why: str) -> ArchiveError:
            return ArchiveError(f"case {cid}: field {fieldname}: {why}")

        if self.dtype not in DTYPES:
            raise bad("dtype", f"{self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.values.dtype != STORAGE_DTYPE[self.dtype] or self.values.ndim != 1:
            raise bad("values", f"expected 1-D {STORAGE_DTYPE[self.dtype]} for dtype {self.dtype}, "
                                f"got {self.values.ndim}-D {self.values.dtype}")
        if not isinstance(self.top_k, int) or self.top_k < 1 or self.top_k > MAX_INDEX:
            raise bad("top_k", f"must be an integer in [1, 2^31), got {self.top_k!r}")
        if self.top_k > max(self.cols, MAX_K_BEYOND_COLS):
            raise bad("top_k", f"{self.top_k} is more than the {self.cols} columns and more than "
                               f"{MAX_K_BEYOND_COLS} (no indexer selects that many)")
        if self.cols < 0 or self.cols > MAX_INDEX:
            raise bad("cols", f"must be in [0, 2^31), got {self.cols}")
        if self.row_stride < self.cols or self.row_stride > MAX_INDEX:
            raise bad("row_stride", f"must be in [cols={self.cols}, 2^31), got {self.row_stride}")
        for name in ("row_starts", "row_ends"):
            arr = getattr(self, name)
            if arr.dtype != np.int32 or arr.ndim != 1:
                raise bad(name, f"expected 1-D int32, got {arr.ndim}-D {arr.dtype}")
        if self.row_ends.shape != self.row_starts.shape:
            raise bad("row_ends", f"has {self.row_ends.shape[0]} rows, row_starts has {self.row_starts.shape[0]}")
        _check_bounds(cid, self.row_starts, self.row_ends, self.cols)
        if self.offsets.dtype != np.int64 or self.offsets.shape != (self.rows + 1,):
            raise bad("offsets", f"expected int64 of shape ({self.rows + 1},), got {self.offsets.dtype} "
                                 f"{self.offsets.shape}")
        if self.offsets[0] != 0 or not np.array_equal(np.diff(self.offsets), self.lengths):
            r = int(np.argmax(np.diff(self.offsets) != self.lengths)) if self.rows else 0
            raise bad("offsets", f"inconsistent with row bounds (first at row {r})")
        if self.values.shape[0] != self.offsets[-1]:
            raise bad("values", f"holds {self.values.shape[0]} elements, offsets say {int(self.offsets[-1])}")
        if self.reference_indices is not None:
            ref = self.reference_indices
            if ref.dtype != np.int32 or ref.shape != (self.rows, self.top_k):
                raise bad("reference_indices", f"expected int32 ({self.rows}, {self.top_k}), "
                                               f"got {ref.dtype} {ref.shape}")
        try:
            json.dumps(self.attrs, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise bad("attrs", f"not a JSON object: {e}") from None
        check_decode(cid, self.attrs, self.row_starts, self.row_ends, self.cols)

    def torch_values(self) -> torch.Tensor:
        """The ragged values as a torch tensor of the logical dtype (zero-copy)."""
        return _numpy_to_torch(self.values, self.dtype)

    def row(self, r: int) -> torch.Tensor:
        return self.torch_values()[int(self.offsets[r]):int(self.offsets[r + 1])]

    def sha256(self) -> str:
        return sha256_of(self.values)

    def padded(
        self,
        row_stride: int | None = None,
        poison: float = 1e30,
        device: str | torch.device = "cpu",
    ) -> torch.Tensor:
        """The (rows, cols) logits matrix as the kernel saw it: a view with stride(0) == row_stride.

        Cells outside `[start, end)` hold `poison` (a huge finite by default, NaN on request), so a
        selector that reads out of bounds returns values the reference never selects.
        """
        stride = self.row_stride if row_stride is None else int(row_stride)
        if stride < self.cols:
            raise ArchiveError(f"case {self.case_id}: field row_stride: {stride} < cols {self.cols}")
        # rows x row_stride are claims of the case: refused (one line) beyond the device's free memory.
        check_memory(f"case {self.case_id}", f"its padded matrix ({self.rows} x {stride})",
                     max(self.rows, 1) * stride * ELEMENT_BYTES[self.dtype], device)
        storage = torch.full((max(self.rows, 1) * stride,), poison, dtype=_TORCH_DTYPE[self.dtype], device=device)
        if self.values.size:
            dev = storage.device
            lengths = torch.from_numpy(self.lengths).to(dev)
            rows = torch.repeat_interleave(torch.arange(self.rows, device=dev), lengths)
            offsets = torch.from_numpy(self.offsets).to(dev)
            starts = torch.from_numpy(self.row_starts.astype(np.int64)).to(dev)
            pos = torch.arange(self.values.shape[0], device=dev) - offsets[rows] + starts[rows]
            storage[rows * stride + pos] = self.torch_values().to(dev)
        return storage.as_strided((self.rows, self.cols), (stride, 1))


def gather_rows(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Concatenate `logits[r, starts[r]:ends[r]]` over rows without a Python loop (any device)."""
    dev = logits.device
    starts = starts.to(dev, torch.int64)
    lengths = ends.to(dev, torch.int64) - starts
    total = int(lengths.sum())
    if total == 0:
        return logits.new_empty((0,))
    rows = torch.repeat_interleave(torch.arange(logits.shape[0], device=dev), lengths)
    first = torch.cumsum(lengths, 0) - lengths
    cols = torch.arange(total, device=dev) - first[rows] + starts[rows]
    return logits[rows, cols]


def _check_bounds(cid: str, starts: np.ndarray, ends: np.ndarray, cols: int) -> None:
    for name, cond in (("row_starts", starts < 0), ("row_ends", ends < starts), ("row_ends", ends > cols)):
        if cond.any():
            r = int(np.argmax(cond))
            raise ArchiveError(f"case {cid}: field {name}: row {r} violates 0 <= start <= end <= cols "
                               f"(start={int(starts[r])}, end={int(ends[r])}, cols={cols})")


def _logical_dtype(x: np.ndarray | torch.Tensor) -> str:
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            return "bfloat16"
        if x.dtype == torch.float32:
            return "float32"
        raise ArchiveError(f"field values: dtype {x.dtype} is not one of {', '.join(DTYPES)}")
    if x.dtype == np.float32:
        return "float32"
    raise ArchiveError(f"field values: numpy dtype {x.dtype} is not float32 (pass bfloat16 as a torch tensor)")


def _to_numpy(x: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().contiguous()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view(np.uint16)
        return x.numpy()
    return np.ascontiguousarray(x)


def _numpy_to_torch(a: np.ndarray, dtype: str = "float32") -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def sha256_of(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).data).hexdigest()
