"""Stand-in sgl_kernel: the DSA top-k entry points SGLang 0.5.23 imports from it, as torch bodies. Outputs
are the kernels': row-local indices (`fast_topk_v2`), page-table slots (`fast_topk_transform_fused`) or
offset positions (`fast_topk_transform_ragged_fused`), -1 past a row's length. No host sync."""

from __future__ import annotations

import torch


def select_local(score: torch.Tensor, lengths: torch.Tensor, topk: int,
                 row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Row r's `topk` largest of score[r, start : start + lengths[r]] as indices relative to start, largest
    first, -1 past the row's length."""
    rows, cols = score.shape
    starts = (torch.zeros_like(lengths) if row_starts is None else row_starts).to(torch.int64)
    ends = starts + lengths.to(torch.int64)
    col = torch.arange(cols, device=score.device)
    valid = (col[None, :] >= starts[:, None]) & (col[None, :] < ends[:, None])
    masked = score.float().masked_fill(~valid, float("-inf"))
    k = min(topk, cols)
    values, index = masked.topk(k, dim=1)
    local = (index - starts[:, None]).to(torch.int32).masked_fill(values == float("-inf"), -1)
    out = torch.full((rows, topk), -1, dtype=torch.int32, device=score.device)
    out[:, :k] = local
    return out


def fast_topk_v2(score: torch.Tensor, lengths: torch.Tensor, topk: int,
                 row_starts: torch.Tensor | None = None) -> torch.Tensor:
    return select_local(score, lengths, topk, row_starts)


def fast_topk_transform_fused(score: torch.Tensor, lengths: torch.Tensor, page_table_size_1: torch.Tensor,
                              cu_seqlens_q: torch.Tensor | None, topk: int,
                              row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Selected index i of row r (request b, from `cu_seqlens_q`) -> page_table_size_1[b, i]."""
    local = select_local(score, lengths, topk, row_starts)
    rows = score.shape[0]
    row = torch.arange(rows, device=score.device)
    batch = row if cu_seqlens_q is None else torch.searchsorted(cu_seqlens_q[1:].to(torch.int64), row, right=True)
    slots = page_table_size_1[batch[:, None], local.clamp(min=0).to(torch.int64)]
    return torch.where(local >= 0, slots.to(torch.int32), -1)


def fast_topk_transform_ragged_fused(score: torch.Tensor, lengths: torch.Tensor, topk_indices_offset: torch.Tensor,
                                     topk: int, row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """Selected index i of row r -> i + topk_indices_offset[r]."""
    local = select_local(score, lengths, topk, row_starts)
    return torch.where(local >= 0, local + topk_indices_offset[:, None].to(torch.int32), -1)
