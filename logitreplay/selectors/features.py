"""Distribution features of a case, cheap enough to compute at dispatch time from a sample of its rows.

A width rule cannot see what makes one selector slow on one input: where the scores' top values sit in
the coarse histogram bins that radix selects pass over first, and where they sit along the row.
`features` measures that on at most `SAMPLE_ROWS` rows spread over the case (a few milliseconds on the
widest decode batch):

- `bin_load`: keys in the coarse bin of the row's k-th largest value, per top_k (native's first pass:
  the fp16 11-bit bin, the same bin as split's magnitude round over most of the range). About 0.01 on
  normal scores at 16K columns; 1 or more where the top values pile into one bin (scores + 100, * 1e-8,
  ties, flooded rows), where histogram passes repeat over one large bin and buffers overflow;
- `fill`: the median row length over the width (decode rows are far shorter than the width; a prefill
  chunk's causal rows are nearly full; a chunk of several requests, or edge rows, far less);
- `crowding`: the row's top k counted in each of `PARTS` equal parts of the row; the fullest part's
  count over the count an even spread puts there (k / PARTS). About 1.1 on independent scores (1 to
  PARTS); 2 to 5 on an indexer's scores, whose recency piles the top k into the part nearest the query.
  DeepSelect sizes its first threshold from the share of the row its first round reads (design.md,
  item 15), a bet that an uneven spread loses.

Rows no longer than top_k select everything and say nothing about bins or positions; a case of only
such rows has `bin_load` and `crowding` 0.
"""

from __future__ import annotations

import numpy as np
import torch

from logitreplay.archive import Case
from logitreplay.selectors.cpu_models import f16_bin

SAMPLE_ROWS = 32
PARTS = 8
FEATURES: tuple[str, ...] = ("bin_load", "fill", "crowding")


def features(case: Case) -> dict[str, float]:
    """The case's `FEATURES` (see the module docstring), from evenly spaced sample rows."""
    lengths = case.lengths
    fill = float(np.median(lengths)) / max(case.cols, 1) if lengths.size else 0.0
    long_rows = np.flatnonzero(lengths > case.top_k)
    sample = long_rows[np.linspace(0, long_rows.size - 1, min(SAMPLE_ROWS, long_rows.size)).astype(np.int64)]
    loads, crowds = [], []
    for r in sample.tolist():
        x = case.row(r).float()
        top = torch.topk(x, case.top_k)
        kth = top.values[-1]
        bins = f16_bin(x)
        loads.append(int((bins == f16_bin(kth.reshape(1))).sum()) / case.top_k)
        parts = torch.bincount(top.indices * PARTS // x.numel(), minlength=PARTS)
        crowds.append(int(parts.max()) * PARTS / case.top_k)
    return {"bin_load": float(np.median(loads)) if loads else 0.0, "fill": fill,
            "crowding": float(np.median(crowds)) if crowds else 0.0}


__all__ = ["FEATURES", "PARTS", "SAMPLE_ROWS", "features"]
