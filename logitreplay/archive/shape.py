"""What a case's bounds show about the call that made it: a prefill chunk or a decode batch, and MTP's next_n.

A case made by `Case.from_matrix`, imported from safetensors or captured by a tool that does not label
it carries no `kind`, and a dispatcher that reads only the label treats every such decode batch as a
prefill chunk. The bounds say which it is:

- a **prefill chunk**'s row ends climb by one per row (query token t of a request sees one more key than
  token t - 1), over runs as long as the request's share of the chunk;
- a **decode batch** has one row per request (per request and draft token under MTP), each ending where
  its own context ends: ends independent of each other, across a matrix as wide as the longest context
  the model serves, so rows << columns (`DECODE_COLS_PER_ROW`);
- **MTP** rows come in groups of next_n whose ends step by one inside a group (vLLM's `seq_lens - next_n +
  1 + i`, clamped at 0), independent between groups.

`infer` reads that off the bounds in this order: runs of ends climbing by one that cover at least half
the rows and are longer than any MTP group -> prefill; rows not far fewer than columns -> prefill (a chunk
of edge or repeated rows); else decode, with the largest next_n (up to `MAX_NEXT_N`) whose every group
steps by one, or 1. `kind_for` takes a label when the case has one and notes where its bounds disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

MAX_NEXT_N = 8  # the longest MTP group looked for (vLLM's speculative decode uses 1 to 4 draft tokens)
DECODE_COLS_PER_ROW = 32  # a decode batch's width is at least this many columns per row


@dataclass(frozen=True)
class Shape:
    """What the bounds show: `kind` ("prefill" or "decode"), `next_n` (1 unless MTP groups were seen),
    `short` (every row no longer than top_k: a selection of everything) and `why`, in words."""

    kind: str
    next_n: int
    short: bool
    why: str


def _climbs(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per consecutive row pair: the second row is the first's request one token on (same start, end + 1)."""
    return (np.diff(starts) == 0) & (np.diff(ends) == 1)


def _long_run_rows(climbs: np.ndarray) -> tuple[int, int]:
    """(rows in runs of climbing ends longer than MAX_NEXT_N, the longest run) of a row order."""
    covered, longest, run = 0, 1, 1
    for step in [*climbs.tolist(), False]:
        if step:
            run += 1
            continue
        longest = max(longest, run)
        covered += run if run > MAX_NEXT_N else 0
        run = 1
    return covered, longest


def _mtp_groups(ends: np.ndarray) -> int:
    """The largest n <= MAX_NEXT_N, n > 1, dividing the rows whose every group of n consecutive rows ends
    one further per row (or at 0, clamped, before it climbs); 1 when none does."""
    rows = ends.size
    for n in range(min(MAX_NEXT_N, rows), 1, -1):
        if rows % n:
            continue
        g = ends.reshape(-1, n).astype(np.int64)
        steps = np.diff(g, axis=1)
        if np.all((steps == 1) | ((steps == 0) & (g[:, 1:] == 0))) and np.any(steps == 1):
            return n
    return 1


def infer(row_starts: np.ndarray, row_ends: np.ndarray, cols: int, top_k: int) -> Shape:
    """The kind and next_n the bounds show (module docstring), and why."""
    starts, ends = np.asarray(row_starts, np.int64), np.asarray(row_ends, np.int64)
    rows = int(ends.size)
    short = bool(rows and np.all(ends - starts <= top_k))
    if rows == 0:
        return Shape("prefill", 1, short, "no rows")
    covered, longest = _long_run_rows(_climbs(starts, ends))
    if 2 * covered >= rows:
        return Shape("prefill", 1, short, f"ends climb by one per row (runs up to {longest} rows)")
    if rows * DECODE_COLS_PER_ROW > cols:
        return Shape("prefill", 1, short, f"{rows} rows over {cols} columns: too many rows for a decode batch")
    n = _mtp_groups(ends) if np.all(starts == 0) else 1
    if n > 1:
        return Shape("decode", n, short, f"{rows} rows << {cols} columns, ends step by one in groups of {n} (MTP)")
    return Shape("decode", 1, short, f"{rows} rows << {cols} columns with independent ends")


def kind_for(attrs: dict[str, Any], row_starts: np.ndarray, row_ends: np.ndarray, cols: int,
             top_k: int) -> tuple[str, str]:
    """(kind, how it was known) for dispatch: the case's `kind` label where it has one (with a note when its
    bounds show the other kind), else the kind its bounds show."""
    shape = infer(row_starts, row_ends, cols, top_k)
    label = attrs.get("kind")
    if label is None:
        return shape.kind, f"{shape.kind} from the bounds: {shape.why}"
    if label != shape.kind:
        return str(label), f"labelled {label}, but the bounds show {shape.kind}: {shape.why}"
    return str(label), f"labelled {label}"


__all__ = ["DECODE_COLS_PER_ROW", "MAX_NEXT_N", "Shape", "infer", "kind_for"]
