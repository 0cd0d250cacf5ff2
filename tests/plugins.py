"""Selector plugins for the tests: one good one and one per bug verification must catch.

Each broken selector runs the reference into a scratch buffer, then makes one realistic mistake while
writing the caller's output view. `plugin_case()` is the case they are run on; the rows each mistake
first shows up in are the constants below, so the tests can assert check *and* row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.reference import ReferenceSelector

TOP_K = 8
# (start, end) per row: full, shorter than k, partial, starting past column 0, short and past 0, empty.
BOUNDS = [(0, 64), (0, 5), (0, 30), (40, 60), (10, 14), (0, 0)]
LONG_ROW = 3  # longer than k and starting at column 40: where single-row corruptions are made
FIRST_SHORT_ROW = 1  # the first row shorter than k: where a missing -1 tail first shows
FIRST_OFFSET_ROW = 3  # the first row with a non-zero start: where absolute indices first show

# corrupt(out, scratch, logits, row_starts, row_ends): writes `out` from the reference's `scratch`
Corrupt = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def plugin_case(case_id: str = "plugins", nan_row: int | None = None) -> Case:
    """Distinct normal values on `BOUNDS` (64 columns); optionally a NaN inside row `nan_row`."""
    starts = np.array([s for s, _ in BOUNDS], dtype=np.int32)
    ends = np.array([e for _, e in BOUNDS], dtype=np.int32)
    rng = np.random.default_rng(7)
    values = rng.permutation(int((ends - starts).sum())).astype(np.float32) / 7 - 3
    if nan_row is not None:
        offset = int((ends - starts)[:nan_row].sum())
        values[offset + 1] = np.nan
    return Case.from_rows(case_id, values, starts, ends, top_k=TOP_K, cols=64, attrs={"source": "test"})


class _Corrupting:
    """The reference selection, then `corrupt(out, scratch, starts, ends)` writes the caller's view."""

    def __init__(self, name: str, corrupt: Corrupt) -> None:
        self.name = name
        self._corrupt = corrupt

    def supports(self, case: Case, device: torch.device) -> str | None:
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        scratch = torch.empty_like(out, memory_format=torch.contiguous_format)
        reference = ReferenceSelector().prepare(logits, row_starts, row_ends, top_k, scratch)

        def launch() -> None:
            reference()
            self._corrupt(out, scratch, logits, row_starts, row_ends)

        return launch


def _copy(out, scratch, logits, starts, ends):
    out.copy_(scratch)


def make_good() -> _Corrupting:
    return _Corrupting("good", _copy)


def make_out_of_range() -> _Corrupting:
    def corrupt(out, scratch, logits, starts, ends):
        out.copy_(scratch)
        out[LONG_ROW, 0] = int(ends[LONG_ROW] - starts[LONG_ROW])  # one past the last valid index

    return _Corrupting("out-of-range", corrupt)


def make_duplicate() -> _Corrupting:
    def corrupt(out, scratch, logits, starts, ends):
        out.copy_(scratch)
        out[LONG_ROW, 1] = out[LONG_ROW, 0]

    return _Corrupting("duplicate", corrupt)


def make_missing_tail() -> _Corrupting:
    """Writes only the valid slots of every row: the -1 tail of short rows is never written."""

    def corrupt(out, scratch, logits, starts, ends):
        for r in range(out.shape[0]):
            n = min(out.shape[1], int(ends[r] - starts[r]))
            out[r, :n] = scratch[r, :n]

    return _Corrupting("missing-tail", corrupt)


def make_wrong_value() -> _Corrupting:
    """Swaps one selected index of the long row for the index of that row's smallest value."""

    def corrupt(out, scratch, logits, starts, ends):
        out.copy_(scratch)
        s, e = int(starts[LONG_ROW]), int(ends[LONG_ROW])
        out[LONG_ROW, 0] = int(torch.argmin(logits[LONG_ROW, s:e]))

    return _Corrupting("wrong-value", corrupt)


def make_write_past_view() -> _Corrupting:
    """Correct output, plus one write just right of the long row's last slot (ignores the view's end)."""

    def corrupt(out, scratch, logits, starts, ends):
        out.copy_(scratch)
        at = out.storage_offset() + LONG_ROW * out.stride(0) + out.shape[1]
        out.as_strided((1,), (1,), at).fill_(0)

    return _Corrupting("write-past-view", corrupt)


def make_absolute() -> _Corrupting:
    """Column indices of the source matrix instead of indices relative to the row start."""

    def corrupt(out, scratch, logits, starts, ends):
        out.copy_(torch.where(scratch >= 0, scratch + starts.unsqueeze(1), scratch))

    return _Corrupting("absolute", corrupt)


def make_lossy() -> _Corrupting:
    """An approximate selector: in every row longer than k it selects the (k+1)-th largest value instead
    of the k-th (recall (k - 1) / k there, exact elsewhere)."""

    def corrupt(out, scratch, logits, starts, ends):
        out.copy_(scratch)
        k = out.shape[1]
        for r in range(out.shape[0]):
            s, e = int(starts[r]), int(ends[r])
            if e - s > k:
                order = torch.argsort(logits[r, s:e], descending=True)
                out[r][out[r] == order[k - 1]] = int(order[k])

    return _Corrupting("lossy", corrupt)


def tie_case(case_id: str = "ties") -> Case:
    """Rows whose k-th value is tied: in each, 3 values above a plateau of tied values at the k-th, and
    lower values after it, so a selector must choose k - 3 of the plateau (`BOUNDS`, no empty rows)."""
    starts = np.array([s for s, _ in BOUNDS[:-1]], dtype=np.int32)
    ends = np.array([e for _, e in BOUNDS[:-1]], dtype=np.int32)
    rows = []
    for s, e in zip(starts, ends, strict=True):
        n = int(e - s)
        row = np.full(n, -2.0, dtype=np.float32)
        row[n // 2:n // 2 + 3] = [9.0, 8.0, 7.0][: max(0, n - n // 2)]  # above the plateau, mid-row
        row[: n // 2] = 1.0  # the plateau of ties, the lowest and the highest indices both among them
        row[n // 2 + 3:] = np.where(np.arange(n - n // 2 - 3) % 2 == 0, 1.0, -2.0)
        rows.append(row)
    return Case.from_rows(case_id, np.concatenate(rows), starts, ends, top_k=TOP_K, cols=64,
                          attrs={"source": "test"})


# choose(tied candidate indices ascending, how many to take, the call's number) -> the ones taken, in order
Choose = Callable[[torch.Tensor, int, int], torch.Tensor]


class _TieChoosing:
    """An exact selector (every value right) whose choice among the candidates tied at each row's k-th
    value is `choose`'s: a stated tie policy, or one that changes from call to call."""

    def __init__(self, name: str, choose: Choose) -> None:
        self.name = name
        self._choose = choose

    def supports(self, case: Case, device: torch.device) -> str | None:
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        calls = [0]

        def launch() -> None:
            calls[0] += 1
            out.fill_(-1)
            for r in range(out.shape[0]):
                s, e = int(row_starts[r]), int(row_ends[r])
                row = logits[r, s:e]
                if e - s <= top_k:
                    out[r, :e - s] = torch.arange(e - s, dtype=torch.int32)
                    continue
                kth = row.sort(descending=True).values[top_k - 1]
                above = (row > kth).nonzero().flatten()
                taken = self._choose((row == kth).nonzero().flatten(), top_k - above.numel(), calls[0])
                out[r] = torch.cat([above, taken]).to(torch.int32)

        return launch


def make_lowest_first() -> _TieChoosing:
    return _TieChoosing("lowest-first", lambda tied, n, call: tied[:n])


def make_highest_first() -> _TieChoosing:
    return _TieChoosing("highest-first", lambda tied, n, call: tied.flip(0)[:n])


def make_nondeterministic() -> _TieChoosing:
    """Another subset of the tied candidates on every call (as racing atomics would choose)."""
    return _TieChoosing("nondeterministic", lambda tied, n, call: tied.roll(call)[:n])


def make_unordered() -> _TieChoosing:
    """The lowest tied candidates every time, but their order reversed on every other call."""
    return _TieChoosing("unordered", lambda tied, n, call: tied[:n].flip(0) if call % 2 else tied[:n])


def make_raises() -> _Corrupting:
    def corrupt(out, scratch, logits, starts, ends):
        raise RuntimeError("deliberate failure inside the launch")

    return _Corrupting("raises", corrupt)


def make_factory_raises() -> _Corrupting:
    raise RuntimeError("deliberate failure inside the factory")


# plugin factory -> (check number, row) that verification must report
EXPECTED = {
    "make_out_of_range": (1, LONG_ROW),
    "make_duplicate": (1, LONG_ROW),
    "make_missing_tail": (2, FIRST_SHORT_ROW),
    "make_wrong_value": (3, LONG_ROW),
    "make_write_past_view": (4, LONG_ROW),
    "make_absolute": (1, FIRST_OFFSET_ROW),
}
