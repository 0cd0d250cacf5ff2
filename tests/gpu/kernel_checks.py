"""The check every GPU kernel test runs: checks 1-4 of docs/design.md on one launch into a strided, sentinel-padded
output view, then check 5 (a CUDA graph replayed after the row ends changed in place)."""

from __future__ import annotations

import torch

from logitreplay.archive import Case
from logitreplay.replay.graph_check import graph_replay_check
from logitreplay.replay.verify import Failure, OutputBuffer, Prepared, check_output, expected_values
from logitreplay.selectors.base import Selector


def launched(sel: Selector, case: Case, poison: float = 1e30) -> Prepared:
    """The selector prepared on the case's padded, poisoned logits on the GPU, launched once (synchronized)."""
    device = torch.device("cuda")
    assert sel.supports(case, device) is None
    logits = case.padded(poison=poison, device=device)
    starts = torch.from_numpy(case.row_starts).to(device)
    ends = torch.from_numpy(case.row_ends).to(device)
    out = OutputBuffer(case.rows, case.top_k, device)
    launch = sel.prepare(logits, starts, ends, case.top_k, out.view)
    launch()
    torch.cuda.synchronize()
    return Prepared(case, sel, launch, out, logits, starts, ends)


def verify_kernel(sel: Selector, case: Case, poison: float = 1e30) -> list[Failure]:
    p = launched(sel, case, poison)
    failures = check_output(case, p.logits, p.row_starts, p.row_ends, p.output,
                            expected_values(p.logits, p.row_starts, p.row_ends, case.top_k))
    return failures or graph_replay_check(p)
