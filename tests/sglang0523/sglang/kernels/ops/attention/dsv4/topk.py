"""Stand-in of SGLang 0.5.23's default DSA top-k ("v2", a JIT kernel upstream): the entry points
`DSATopKBackend` calls, with their output contracts and the ragged kernel's in-place masking of the <= 3
columns ahead of each row's window (its 16-byte-aligned read base)."""

from __future__ import annotations

import torch
from sgl_kernel import select_local

_PLAN_METADATA_INTS_PER_BATCH = 2


def plan_topk_v2(seq_lens: torch.Tensor, static_threshold: int = -1, *,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    bs = seq_lens.shape[0]
    metadata = seq_lens.new_empty(bs + 1, _PLAN_METADATA_INTS_PER_BATCH) if out is None else out
    metadata.fill_(0)
    return metadata


def topk_transform_ragged_v2(scores: torch.Tensor, seq_lens: torch.Tensor, *, out_offsets: torch.Tensor,
                             out_indices: torch.Tensor, row_starts: torch.Tensor | None = None) -> None:
    """Row i: top-k of scores[i, ks : ks + seq_lens[i]] written as position + out_offsets[i], -1 padded."""
    topk = out_indices.shape[1]
    local = select_local(scores, seq_lens, topk, row_starts)
    out_indices.copy_(torch.where(local >= 0, local + out_offsets[:, None].to(torch.int32), -1))
    if row_starts is not None:
        col = torch.arange(scores.shape[1], device=scores.device)[None, :]
        ks = row_starts.to(torch.int64)[:, None]
        scores.masked_fill_((col >= ks - ks % 4) & (col < ks), float("-inf"))


def topk_transform_paged_v2(scores: torch.Tensor, seq_lens: torch.Tensor, page_tables: torch.Tensor | None,
                            out_page_indices: torch.Tensor, page_size: int, metadata: torch.Tensor,
                            out_raw_indices: torch.Tensor | None = None) -> None:
    """Selected index p of row r -> page_tables[r, p // page_size] * page_size + p % page_size."""
    local = select_local(scores, seq_lens, out_page_indices.shape[1])
    if out_raw_indices is not None:
        out_raw_indices.copy_(local)
    if page_tables is None:
        out_page_indices.copy_(local)
        return
    p = local.clamp(min=0).to(torch.int64)
    row = torch.arange(scores.shape[0], device=scores.device)[:, None]
    slots = page_tables[row, p // page_size].to(torch.int64) * page_size + p % page_size
    out_page_indices.copy_(torch.where(local >= 0, slots.to(torch.int32), -1))
