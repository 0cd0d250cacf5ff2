"""`DSATopKBackend` (`--dsa-topk-backend`: sgl-kernel, torch, flashinfer) and its `topk_transform` dispatch,
as in 0.5.23: unfused (`topk_func`) unless SGLANG_DSA_FUSE_TOPK, then the v2 paged / v2 ragged kernels for
decode- and extend-shaped calls of the sgl-kernel backend, else sgl_kernel's legacy fused transforms over
`page_table_1`. FlashInfer is not part of this stand-in (its branches raise)."""

from __future__ import annotations

from enum import Enum, IntEnum, auto

import torch
from sglang.srt.environ import envs
from sglang.srt.utils import is_hip

_is_hip = is_hip()


class TopkTransformMethod(IntEnum):
    PAGED = auto()  # indices into the page table (page size 1)
    RAGGED = auto()  # indices into the ragged (flattened) KV


class DSATopKBackend(Enum):
    SGL_KERNEL = "sgl-kernel"
    TORCH = "torch"
    FLASHINFER = "flashinfer"

    def is_sgl_kernel(self) -> bool:
        return self == DSATopKBackend.SGL_KERNEL

    def is_torch(self) -> bool:
        return self == DSATopKBackend.TORCH

    def is_flashinfer(self) -> bool:
        return self == DSATopKBackend.FLASHINFER

    def should_use_topk_v2(self) -> bool:
        return self.is_sgl_kernel() and envs.SGLANG_OPT_USE_TOPK_V2.get()

    def topk_func(self, score: torch.Tensor, lengths: torch.Tensor, topk: int,
                  row_starts: torch.Tensor | None = None) -> torch.Tensor:
        if self.is_sgl_kernel():
            from sgl_kernel import fast_topk_v2

            return fast_topk_v2(score, lengths, topk, row_starts=row_starts)
        if self.is_torch():
            return _topk_unfused(score, lengths, topk, row_starts=row_starts)
        raise RuntimeError(f"{self} is not part of this stand-in")

    def topk_transform(self, logits: torch.Tensor, lengths: torch.Tensor, topk: int,
                       topk_transform_method: TopkTransformMethod, attn_metadata,  # noqa: ANN001
                       cu_seqlens_q_topk: torch.Tensor | None = None,
                       topk_indices_offset: torch.Tensor | None = None,
                       row_starts: torch.Tensor | None = None, batch_idx_list=None,  # noqa: ANN001
                       force_unfused_topk: bool = False) -> torch.Tensor:
        if not envs.SGLANG_DSA_FUSE_TOPK.get() or force_unfused_topk:
            return self.topk_func(logits, lengths, topk, row_starts=row_starts)
        if (self.should_use_topk_v2() and topk_transform_method == TopkTransformMethod.PAGED
                and row_starts is None and batch_idx_list is None and 0 < topk <= 2048
                and lengths.shape[0] == logits.shape[0] == attn_metadata.real_page_table.shape[0]):
            return _topk_transform_v2_paged(logits, lengths, topk, attn_metadata)
        if (self.should_use_topk_v2() and topk_transform_method == TopkTransformMethod.RAGGED
                and topk_indices_offset is not None and batch_idx_list is None and 0 < topk <= 2048
                and lengths.shape[0] == logits.shape[0] == topk_indices_offset.shape[0]):
            return _topk_transform_v2_ragged(logits, lengths, topk, topk_indices_offset, row_starts)
        assert attn_metadata.page_table_1 is not None
        if self.is_sgl_kernel():
            from sgl_kernel import fast_topk_transform_fused, fast_topk_transform_ragged_fused

            if topk_transform_method == TopkTransformMethod.PAGED:
                page_table_size_1 = (attn_metadata.page_table_1[batch_idx_list] if batch_idx_list is not None
                                     else attn_metadata.page_table_1)
                return fast_topk_transform_fused(score=logits, lengths=lengths, page_table_size_1=page_table_size_1,
                                                 cu_seqlens_q=cu_seqlens_q_topk, topk=topk, row_starts=row_starts)
            if topk_transform_method == TopkTransformMethod.RAGGED:
                if topk_indices_offset is None:
                    raise RuntimeError("RAGGED topk_transform requires topk_indices_offset")
                return fast_topk_transform_ragged_fused(score=logits, lengths=lengths,
                                                        topk_indices_offset=topk_indices_offset, topk=topk,
                                                        row_starts=row_starts)
        raise RuntimeError(f"Unsupported {self = } for SGLANG_DSA_FUSE_TOPK.")


def _topk_unfused(score: torch.Tensor, lengths: torch.Tensor, topk: int,
                  row_starts: torch.Tensor | None = None) -> torch.Tensor:
    """torch.topk over the row's window masked to -inf elsewhere; row-local indices, -1 where masked."""
    rows, width = score.shape
    out = score.new_full((rows, topk), -1, dtype=torch.int32)
    if rows == 0 or topk == 0 or width == 0:
        return out
    starts = (torch.zeros_like(lengths, dtype=torch.int32) if row_starts is None
              else row_starts.to(torch.int32))
    col = torch.arange(width, dtype=torch.int32, device=score.device)[None, :]
    valid = (col >= starts[:, None]) & (col < (starts + lengths.to(torch.int32))[:, None])
    k = min(topk, width)
    values, index = torch.topk(score.masked_fill(~valid, float("-inf")), k, dim=-1)
    out[:, :k] = (index.to(torch.int32) - starts[:, None]).masked_fill(values == float("-inf"), -1)
    return out


def _topk_transform_v2_paged(logits: torch.Tensor, lengths: torch.Tensor, topk: int,
                             attn_metadata) -> torch.Tensor:  # noqa: ANN001
    from sglang.kernels.ops.attention.dsv4.topk import topk_transform_paged_v2

    assert logits.dtype == torch.float32 and logits.stride(1) == 1 and logits.stride(0) % 4 == 0
    plan = attn_metadata.topk_v2_plan
    assert plan is not None and plan.shape[0] == logits.shape[0] + 1
    out = logits.new_empty((logits.shape[0], topk), dtype=torch.int32)
    topk_transform_paged_v2(logits, lengths, attn_metadata.real_page_table, out, attn_metadata.page_size, plan)
    return out


def _topk_transform_v2_ragged(logits: torch.Tensor, lengths: torch.Tensor, topk: int,
                              topk_indices_offset: torch.Tensor, row_starts: torch.Tensor | None) -> torch.Tensor:
    from sglang.kernels.ops.attention.dsv4.topk import topk_transform_ragged_v2

    out = logits.new_empty((logits.shape[0], topk), dtype=torch.int32)
    topk_transform_ragged_v2(logits, lengths, out_offsets=topk_indices_offset, out_indices=out,
                             row_starts=row_starts)
    return out
