"""`DSAIndexerMetadata.topk_transform`: the call the indexer's paged and ragged paths make; it derives the
row lengths, the RAGGED offsets and the PAGED per-request row prefix sums and hands them to the backend."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from sglang.srt.layers.attention.dsa.dsa_backend_mtp_precompute import compute_cu_seqlens
from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend, TopkTransformMethod
from sglang.srt.layers.attention.dsa_backend import DSAMetadata


class BaseIndexerMetadata(ABC):
    @abstractmethod
    def topk_transform(self, logits: torch.Tensor, topk: int, **kwargs) -> torch.Tensor:  # noqa: ANN003
        """Select and transform (the result need not be top-k indices of the logits)."""


@dataclass(frozen=True)
class DSAIndexerMetadata(BaseIndexerMetadata):
    attn_metadata: DSAMetadata
    topk_transform_method: TopkTransformMethod
    topk_backend: DSATopKBackend = DSATopKBackend.SGL_KERNEL
    paged_mqa_schedule_metadata: torch.Tensor | None = None
    paged_mqa_ctx_lens_2d: torch.Tensor | None = None
    force_unfused_topk: bool = False

    def get_seqlens_int32(self) -> torch.Tensor:
        return self.attn_metadata.cache_seqlens_int32

    def get_page_table_64(self) -> torch.Tensor:
        return self.attn_metadata.real_page_table

    def get_logical_page_table(self) -> torch.Tensor:
        logical = self.attn_metadata.indexer_logical_page_table
        return self.get_page_table_64() if logical is None else logical

    def get_page_table_1(self) -> torch.Tensor:
        assert self.attn_metadata.page_table_1 is not None
        return self.attn_metadata.page_table_1

    def get_seqlens_expanded(self) -> torch.Tensor:
        return self.attn_metadata.dsa_seqlens_expanded

    def get_indexer_kvcache_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.attn_metadata.indexer_k_start_end is not None
        return self.attn_metadata.indexer_k_start_end

    def get_indexer_seq_len(self) -> torch.Tensor | None:
        return self.attn_metadata.indexer_seq_lens

    def get_indexer_seq_len_cpu(self) -> torch.Tensor | None:
        return self.attn_metadata.indexer_seq_lens_cpu

    def get_dsa_extend_len_cpu(self) -> list[int]:
        return self.attn_metadata.dsa_extend_seq_lens_list

    def get_token_to_batch_idx(self) -> torch.Tensor | None:
        return self.attn_metadata.token_to_batch_idx

    def topk_transform(self, logits: torch.Tensor, topk: int, ks: torch.Tensor | None = None,
                       cu_seqlens_q: torch.Tensor | None = None, ke_offset: torch.Tensor | None = None,
                       batch_idx_list=None,  # noqa: ANN001
                       topk_indices_offset_override: torch.Tensor | None = None) -> torch.Tensor:
        if topk_indices_offset_override is not None:
            cu_topk_indices_offset = topk_indices_offset_override
            cu_seqlens_q_topk = None
        elif cu_seqlens_q is not None:
            cu_seqlens_q = cu_seqlens_q.to(torch.int32)
            cu_seqlens_q_topk = compute_cu_seqlens(cu_seqlens_q)
            cu_topk_indices_offset = torch.repeat_interleave(cu_seqlens_q_topk[:-1], cu_seqlens_q,
                                                             output_size=logits.shape[0])
        else:
            cu_seqlens_q_topk = self.attn_metadata.cu_seqlens_q
            cu_topk_indices_offset = self.attn_metadata.topk_indices_offset
        seq_lens_topk = ke_offset if ke_offset is not None else self.get_seqlens_expanded()
        return self.topk_backend.topk_transform(
            logits=logits, lengths=seq_lens_topk, topk=topk, topk_transform_method=self.topk_transform_method,
            attn_metadata=self.attn_metadata, cu_seqlens_q_topk=cu_seqlens_q_topk,
            topk_indices_offset=cu_topk_indices_offset, row_starts=ks, batch_idx_list=batch_idx_list,
            force_unfused_topk=self.force_unfused_topk)
