"""The indexer's top-k kernels on CPU, served as `sgl_kernel`, `sglang.kernels.ops.attention.dsv4.topk`
and `flashinfer`.

Every kernel selects, per row r, the `topk` largest logits of the row's window: columns
[row_starts[r], row_starts[r] + lengths[r]) (row_starts 0 when not given), as positions p local to the
window; a row of fewer keys selects them all and pads with -1. They differ in what they write for p:
- `fast_topk_v2`: p itself (unfused);
- `fast_topk_transform_fused`: the KV slot `page_table_size_1[b, p]` of the row's request b (rows are
  grouped into requests by `cu_seqlens_q`, one row each when it is None);
- `fast_topk_transform_ragged_fused` and `topk_transform_ragged_v2`: `p + offsets[r]`, the position in the
  batch's flattened keys; v2 also overwrites up to 3 columns just before each window (its aligned
  loads), which is why SGLang treats the logits as dead after it;
- `topk_transform_paged_v2`: `page_table[r, p // page_size] * page_size + p % page_size`;
- FlashInfer's `top_k_page_table_transform`: `page_table[row_to_batch[r], page_table_row_starts[r] + p]`
  (row_to_batch the row itself when None, row starts 0), `top_k_ragged_transform`: `p + offsets[r]`, and
  its `top_k`, torch.topk's contract (values, indices) over whole rows.
Ties go to the lower position (the tests' logits have none).
"""

from __future__ import annotations

import torch

from tests.engine_fakes.sglang.outside import outside_names


def _local(score: torch.Tensor, lengths: torch.Tensor, topk: int,
           row_starts: torch.Tensor | None = None) -> torch.Tensor:
    rows = score.shape[0]
    out = torch.full((rows, topk), -1, dtype=torch.int32)
    for r in range(rows):
        start = 0 if row_starts is None else int(row_starts[r])
        window = score[r, start: start + int(lengths[r])].float()
        k = min(topk, window.shape[0])
        order = torch.sort(window, descending=True, stable=True).indices[:k]
        out[r, :k] = order.to(torch.int32)
    return out


def _through(local: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Each chosen local position p of row r as `table[r, p]` (-1 stays -1)."""
    chosen = local >= 0
    mapped = torch.gather(table.long(), 1, local.clamp(min=0).long())
    return torch.where(chosen, mapped, -1).to(torch.int32)


def fast_topk_v2(score: torch.Tensor, lengths: torch.Tensor, topk: int,
                 row_starts: torch.Tensor | None = None) -> torch.Tensor:
    return _local(score, lengths, topk, row_starts)


def fast_topk_transform_fused(score: torch.Tensor, lengths: torch.Tensor, page_table_size_1: torch.Tensor,
                              cu_seqlens_q: torch.Tensor | None, topk: int,
                              row_starts: torch.Tensor | None = None) -> torch.Tensor:
    local = _local(score, lengths, topk, row_starts)
    rows = torch.arange(score.shape[0])
    request = rows if cu_seqlens_q is None else torch.searchsorted(cu_seqlens_q[1:].long(), rows, right=True)
    return _through(local, page_table_size_1[request])


def fast_topk_transform_ragged_fused(score: torch.Tensor, lengths: torch.Tensor,
                                     topk_indices_offset: torch.Tensor, topk: int,
                                     row_starts: torch.Tensor | None = None) -> torch.Tensor:
    local = _local(score, lengths, topk, row_starts)
    return torch.where(local >= 0, local + topk_indices_offset[:, None].to(torch.int32), -1).to(torch.int32)


def topk_transform_ragged_v2(logits: torch.Tensor, lengths: torch.Tensor, out_offsets: torch.Tensor,
                             out_indices: torch.Tensor, row_starts: torch.Tensor | None = None) -> None:
    topk = out_indices.shape[1]
    out_indices.copy_(fast_topk_transform_ragged_fused(logits, lengths, out_offsets, topk, row_starts))
    if row_starts is not None:
        for r in range(logits.shape[0]):
            start = int(row_starts[r])
            logits[r, max(start - 3, 0): start] = float("-inf")


def topk_transform_paged_v2(logits: torch.Tensor, lengths: torch.Tensor, page_table: torch.Tensor,
                            out: torch.Tensor, page_size: int, plan: torch.Tensor) -> None:
    local = _local(logits, lengths, out.shape[1])
    slots = torch.arange(page_table.shape[1] * page_size)
    table = page_table.long()[:, slots // page_size] * page_size + slots % page_size
    out.copy_(_through(local, table))


def top_k(input: torch.Tensor, k: int, sorted: bool = False, **switches: object) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.topk(input, k, dim=-1, sorted=sorted)


def top_k_page_table_transform(logits: torch.Tensor, page_table: torch.Tensor, lengths: torch.Tensor, topk: int, *,
                               row_to_batch: torch.Tensor | None = None, row_starts: torch.Tensor | None = None,
                               page_table_row_starts: torch.Tensor | None = None, **switches: object) -> torch.Tensor:
    local = _local(logits, lengths, topk, row_starts)
    rows = torch.arange(logits.shape[0])
    table = page_table[rows if row_to_batch is None else row_to_batch.long()]
    if page_table_row_starts is not None:
        shift = page_table_row_starts.long()[:, None]
        return torch.where(local >= 0, _through(local + shift, table), -1).to(torch.int32)
    return _through(local, table)


def top_k_ragged_transform(logits: torch.Tensor, offsets: torch.Tensor, lengths: torch.Tensor, topk: int, *,
                           row_starts: torch.Tensor | None = None, **switches: object) -> torch.Tensor:
    return fast_topk_transform_ragged_fused(logits, lengths, offsets, topk, row_starts)


def plan_topk_v2(lengths: torch.Tensor) -> torch.Tensor:
    """The per-forward plan the paged v2 kernel is given (rows + 1 entries); the CPU kernel reads none."""
    return torch.zeros(lengths.shape[0] + 1, dtype=torch.int32)


__getattr__ = outside_names(__name__)
