"""Check 5 (docs/design.md): a CUDA graph captured once stays correct after the row bounds change in place.

Production captures the indexer's top-k in a CUDA graph and replays it with new metadata every step, so
a selector that reads the bounds on the host, bakes them into launch parameters or sizes its grid from
them passes checks 1-4 on one launch and still breaks in production. This check captures the prepared
launch with the case's bounds, rewrites the row ends in the very tensors the launch reads (some rows
shorter, some below top_k, so -1 tails appear where there were none), replays, and verifies checks 1-4
against the new bounds. The bounds are restored afterwards.
"""

from __future__ import annotations

import torch

from logitreplay.replay.verify import Failure, Prepared, check_output, expected_values

CHECK = 5
NAME = "graph"


def changed_ends(row_starts: torch.Tensor, row_ends: torch.Tensor, top_k: int) -> torch.Tensor:
    """New ends inside the old bounds: even rows keep 5/8 of their length, odd rows fall below top_k."""
    lengths = row_ends - row_starts
    odd = torch.arange(lengths.shape[0], device=lengths.device) % 2 == 1
    shorter = torch.where(odd, torch.clamp(lengths, max=max(top_k // 2, 1) - 1), lengths * 5 // 8)
    return (row_starts + shorter).to(row_ends.dtype)


def graph_replay_check(p: Prepared) -> list[Failure]:
    """Check 5 on a prepared, already verified launch (CUDA only; no-op elsewhere)."""
    if p.logits.device.type != "cuda":
        return []
    original = p.row_ends.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        p.launch()
    try:
        p.row_ends.copy_(changed_ends(p.row_starts, original, p.case.top_k))
        p.output.reset()
        graph.replay()
        torch.cuda.synchronize(p.logits.device)
        expected = expected_values(p.logits, p.row_starts, p.row_ends, p.case.top_k)
        found = check_output(p.case, p.logits, p.row_starts, p.row_ends, p.output, expected, p.min_recall)
    finally:
        p.row_ends.copy_(original)
        torch.cuda.synchronize(p.logits.device)
        del graph
    return [Failure(CHECK, NAME, f.case_id, f.row,
                    f"graph replayed after the row ends changed in place: check {f.check} ({f.name}): {f.detail}")
            for f in found]
