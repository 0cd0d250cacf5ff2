"""Verification of a selector's output against the selection semantics (checks 1-4 of docs/design.md).

Correctness is judged on the selected *values*, never on index sets, because ties at the k-th value may
be broken either way. The output a selector writes is a strided view inside a wider buffer pre-filled
with a sentinel, so a selector that ignores the output stride, writes past its row or skips a slot is
caught. Every check is whole-tensor (no loop over rows), so verification costs about one reference run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from logitreplay.archive import Case
from logitreplay.replay.recall import Damage, damage, row_recall
from logitreplay.selectors.base import Launch, Selector

SENTINEL = -0x5A5A5A5A  # never a valid index nor -1: a slot still holding it was not written
# Columns of sentinel around every output row, and one sentinel row above and below the view.
_PAD_COLS = 8
_EXPECTED_CHUNK_CELLS = 1 << 24

CHECKS = {
    1: "indices",  # every non -1 index in [0, end - start) and unique within its row
    2: "count",  # exactly min(top_k, end - start) valid slots, every other slot exactly -1
    3: "values",  # the multiset of selected values equals the reference's
    4: "bounds",  # nothing outside the output view was written
}
# Beyond checks 1-4 (and 5, the graph replay): the engine's own checks of every selector.
INPUTS_CHECK, INPUTS = 6, "inputs"  # the logits and the row bounds are bit for bit as they were given
TIMED_CHECK, TIMED = 7, "timed"  # the output of the last timed call passes checks 1-4 too


@dataclass(frozen=True)
class Failure:
    """One failed check: `check` is the check number of docs/design.md (5 is the GPU graph-replay check), `name`
    its short name, `row` the first failing row (of the output view; for check 4 the row of the buffer
    row that was overwritten, -1 above the view), `detail` a concrete example from that row."""

    check: int
    name: str
    case_id: str
    row: int
    detail: str

    def __str__(self) -> str:
        return f"check {self.check} ({self.name}) failed on case {self.case_id}, row {self.row}: {self.detail}"


class OutputBuffer:
    """An int32 (rows, top_k) output view with row stride `top_k + 2 * pad` inside a sentinel-filled
    buffer with one spare row above and below: the strided view a production caller might pass."""

    def __init__(self, rows: int, top_k: int, device: torch.device | str) -> None:
        self.rows, self.top_k = rows, top_k
        self.buffer = torch.empty((rows + 2, top_k + 2 * _PAD_COLS), dtype=torch.int32, device=device)
        self.view = self.buffer[1:rows + 1, _PAD_COLS:_PAD_COLS + top_k]
        self.reset()

    def reset(self) -> None:
        self.buffer.fill_(SENTINEL)

    def outside_written(self) -> tuple[int, str] | None:
        """(view row, example) of the first cell outside the view that no longer holds the sentinel."""
        mask = self.buffer != SENTINEL
        mask[1:self.rows + 1, _PAD_COLS:_PAD_COLS + self.top_k] = False
        if not bool(mask.any()):
            return None
        r, c = (int(v) for v in mask.nonzero()[0].tolist())
        where = "left of" if c < _PAD_COLS else "right of" if c >= _PAD_COLS + self.top_k else "in a row outside"
        col = c - _PAD_COLS
        return r - 1, f"wrote {int(self.buffer[r, c])} at output column {col}, {where} the view"


def expected_values(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                    top_k: int) -> torch.Tensor:
    """Each row's `top_k` largest in-bounds values as float32, sorted ascending, -inf for missing slots:
    what any correct selection must select. Computed directly (not through a selector), once per case;
    rows are processed in chunks so that a full-scale case needs no second full-size copy."""
    rows, cols = logits.shape
    out = torch.full((rows, top_k), float("-inf"), dtype=torch.float32, device=logits.device)
    if cols == 0:
        return out
    col = torch.arange(cols, device=logits.device).unsqueeze(0)
    k = min(top_k, cols)
    step = max(1, _EXPECTED_CHUNK_CELLS // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        inside = (col >= row_starts[r0:r1].unsqueeze(1)) & (col < row_ends[r0:r1].unsqueeze(1))
        masked = torch.where(inside, logits[r0:r1].float(), float("-inf"))
        out[r0:r1, top_k - k:] = torch.topk(masked, k, dim=1).values.flip(1)
    return out


def selected_values(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                     idx: torch.Tensor) -> torch.Tensor:
    rows, cols = logits.shape
    valid = (idx >= 0) & (idx < (ends - starts).unsqueeze(1))
    col = (starts.unsqueeze(1).to(torch.int64) + idx.to(torch.int64)).clamp(0, max(cols - 1, 0))
    vals = logits.gather(1, torch.where(valid, col, 0)).float() if cols else logits.new_empty(idx.shape).float()
    vals = torch.where(valid, vals, float("-inf"))
    return vals.sort(dim=1).values


def check_output(case: Case, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                 output: OutputBuffer, expected: torch.Tensor, min_recall: float | None = None) -> list[Failure]:
    """Run checks 1-4 on what a selector wrote into `output`; returns every failed check (empty: verified).

    `expected` is `expected_values` of the case. Each failure reports its first failing row. With
    `min_recall` (`replay --tolerate-recall`), check 3 asks only that every row's recall (recall.py) be
    at least that: an approximate selection passes it.
    """
    out = output.view
    k = out.shape[1]
    lengths = (row_ends - row_starts).to(torch.int64)
    need = lengths.clamp(max=k).unsqueeze(1)
    idx = out.to(torch.int64)
    failures: list[Failure] = []

    def first(rows_mask: torch.Tensor) -> int | None:
        hit = rows_mask.nonzero()
        return int(hit[0, 0]) if hit.numel() else None

    def fail(check: int, row: int, detail: str) -> None:
        failures.append(Failure(check, CHECKS[check], case.case_id, row, detail))

    # 1: every non -1 index in range and unique (the sentinel counts as an unwritten slot: check 2).
    written = (idx != -1) & (idx != SENTINEL)
    out_of_range = written & ((idx < 0) | (idx >= lengths.unsqueeze(1)))
    srt = torch.where(written, idx, -1 - torch.arange(k, device=idx.device)).sort(dim=1).values
    dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
    bad1 = out_of_range.any(1) | dup.any(1)
    row = first(bad1)
    if row is not None:
        if bool(out_of_range[row].any()):
            j = int(out_of_range[row].nonzero()[0, 0])
            fail(1, row, f"slot {j} holds index {int(idx[row, j])}, outside [0, {int(lengths[row])})")
        else:
            j = int(dup[row].nonzero()[0, 0])
            fail(1, row, f"index {int(srt[row, j + 1])} selected twice")
    # 2: min(k, len) valid slots, every other slot -1 (an unwritten slot still holds the sentinel).
    unwritten = idx == SENTINEL
    count = written.sum(1)
    bad2 = unwritten.any(1) | (count != need.squeeze(1))
    row = first(bad2)
    if row is not None:
        if bool(unwritten[row].any()):
            j = int(unwritten[row].nonzero()[0, 0])
            detail = f"slot {j} was never written (expected an index or -1)"
        else:
            detail = f"{int(count[row])} valid slots, expected min(top_k={k}, length={int(lengths[row])})"
        fail(2, row, detail)
    # 3: the selected values, as a sorted multiset, equal the expected ones. Exact comparison, where
    # -0.0 == 0.0 as in the order every selector uses. Rows already failing 1 or 2 are not repeated here.
    got = selected_values(logits, row_starts, row_ends, out)
    diff = got != expected
    recall = None if min_recall is None else row_recall(got, expected, need.squeeze(1))
    wrong = diff.any(1) if recall is None or min_recall is None else recall < min_recall
    row = first(wrong & ~bad1 & ~bad2)
    if row is not None:
        j = int(diff[row].nonzero()[0, 0])
        below = "" if recall is None else f" (recall {float(recall[row]):.4f} below {min_recall})"
        fail(3, row, f"sorted selected values differ at rank {k - j} from the top: "
                     f"{float(got[row, j])!r} vs expected {float(expected[row, j])!r}{below}")
    # 4: nothing outside the view.
    outside = output.outside_written()
    if outside is not None:
        fail(4, outside[0], outside[1])
    return failures


def damage_of(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, out: torch.Tensor,
              expected: torch.Tensor) -> Damage | None:
    """The damage (recall.py) of the selection in the output view `out`; None when its values are exact."""
    need = (row_ends - row_starts).to(torch.int64).clamp(min=0, max=out.shape[1])
    return damage(selected_values(logits, row_starts, row_ends, out), expected, need)


def nan_row(case: Case, device: torch.device | str = "cpu") -> int | None:
    """The first row holding a NaN inside its bounds (such a case is invalid input), or None. Runs on
    `device`: on a full-scale case a host pass over every value would cost seconds of the replay."""
    nan = torch.isnan(case.torch_values().to(device))
    if not bool(nan.any()):
        return None
    first = int(nan.nonzero()[0, 0])
    return int(np.searchsorted(case.offsets, first, side="right")) - 1  # the row whose span holds it


@dataclass
class Inputs:
    """What a selector reads: the padded matrix's whole storage (stride padding and poison included) as
    `flat`, and the row bounds. Every selector gets its own `copy`, compared with the original after it
    ran, so a selector that writes into its inputs fails itself instead of the next selector."""

    flat: torch.Tensor
    rows: int
    cols: int
    stride: int
    row_starts: torch.Tensor
    row_ends: torch.Tensor

    @classmethod
    def of(cls, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor) -> Inputs:
        rows, cols = logits.shape
        stride = logits.stride(0) if rows > 1 else max(cols, 1)
        flat = torch.as_strided(logits, (max(rows, 1) * stride,), (1,), logits.storage_offset())
        return cls(flat, rows, cols, stride, row_starts, row_ends)

    @property
    def logits(self) -> torch.Tensor:
        return self.flat.as_strided((self.rows, self.cols), (self.stride, 1))

    def copy(self) -> Inputs:
        return Inputs(self.flat.clone(), self.rows, self.cols, self.stride, self.row_starts.clone(),
                      self.row_ends.clone())

    def changed(self, case_id: str, original: Inputs) -> Failure | None:
        """Check 6: None when these inputs still equal `original` bit for bit (NaN poison included)."""
        bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[self.flat.dtype]
        for name, mine, theirs in (("logits", self.flat.view(bits), original.flat.view(bits)),
                                   ("row_starts", self.row_starts, original.row_starts),
                                   ("row_ends", self.row_ends, original.row_ends)):
            diff = (mine != theirs).nonzero()
            if diff.numel():
                i = int(diff[0, 0])
                if name == "logits":
                    row, where = i // self.stride, f"logits[{i // self.stride}, {i % self.stride}] (storage)"
                else:
                    row, where = i, f"{name}[{i}] from {int(theirs[i])} to {int(mine[i])}"
                return Failure(INPUTS_CHECK, INPUTS, case_id, min(row, max(self.rows - 1, 0)),
                               f"the selector changed its input: {where}")
        return None


@dataclass
class Prepared:
    """A selector prepared on a case and verified once; what a device `extra_check` gets. `row_starts`
    and `row_ends` are the very tensors `launch` reads, so a check may change them in place (and must
    restore them)."""

    case: Case
    selector: Selector
    launch: Launch
    output: OutputBuffer
    logits: torch.Tensor
    row_starts: torch.Tensor
    row_ends: torch.Tensor
    min_recall: float | None = None  # `replay --tolerate-recall`: check 3 on recall (check_output)


ExtraCheck = Callable[[Prepared], list[Failure]]
