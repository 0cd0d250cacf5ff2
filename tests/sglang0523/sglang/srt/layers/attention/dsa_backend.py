"""`DSAMetadata`: the per-forward metadata of SGLang's DSA attention backend that the indexer's top-k reads
(the fields of 0.5.23 that `DSAIndexerMetadata` and `DSATopKBackend` touch)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DSAMetadata:
    page_size: int
    cache_seqlens_int32: torch.Tensor  # (batch,) KV length of each request
    cu_seqlens_q: torch.Tensor  # (batch + 1,) query rows per request, prefix sums
    cu_seqlens_k: torch.Tensor  # (batch + 1,) keys per request, prefix sums
    page_table_1: torch.Tensor | None  # (batch, max_len) KV slot of each token (page size 1)
    real_page_table: torch.Tensor  # (batch or rows, max_pages) pages of `page_size` tokens
    dsa_seqlens_expanded: torch.Tensor  # (rows,) keys each query row attends to
    dsa_extend_seq_lens_list: list[int]  # host: query rows per request
    topk_v2_plan: torch.Tensor | None = None
    topk_indices_offset: torch.Tensor | None = None  # (rows,) RAGGED: the row's request base in the KV
    indexer_k_start_end: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows,) ks, ke in the KV
    indexer_logical_page_table: torch.Tensor | None = None
    indexer_seq_lens_cpu: torch.Tensor | None = None
    indexer_seq_lens: torch.Tensor | None = None
    token_to_batch_idx: torch.Tensor | None = None


class DeepseekSparseAttnBackend:
    """The DSA attention backend's part in the indexer's top-k: the forward's `DSAMetadata` and the
    `DSAIndexerMetadata` each layer gets (RAGGED for extend over an fp8 KV cache with a flashmla_sparse
    prefill, else PAGED)."""

    def __init__(self, forward_metadata: DSAMetadata, dsa_topk_backend, *, use_fused_topk: bool = True,  # noqa: ANN001
                 dsa_kv_cache_store_fp8: bool = True, dsa_prefill_impl: str = "flashmla_sparse") -> None:
        self.forward_metadata = forward_metadata
        self.dsa_topk_backend = dsa_topk_backend
        self.use_fused_topk = use_fused_topk
        self.dsa_kv_cache_store_fp8 = dsa_kv_cache_store_fp8
        self.dsa_prefill_impl = dsa_prefill_impl
        self.hisparse_coordinator = None

    def get_topk_transform_method(self, forward_mode=None):  # noqa: ANN001, ANN201
        from sglang.srt.layers.attention.dsa.dsa_topk_backend import TopkTransformMethod
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        if (self.dsa_kv_cache_store_fp8 and self.dsa_prefill_impl in ("flashmla_sparse", "triton_sparse_mla")
                and forward_mode == ForwardMode.EXTEND):
            return TopkTransformMethod.RAGGED
        return TopkTransformMethod.PAGED

    def get_indexer_metadata(self, layer_id: int, forward_batch):  # noqa: ANN001, ANN201
        from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import DSAIndexerMetadata

        return DSAIndexerMetadata(attn_metadata=self.forward_metadata,
                                  topk_transform_method=self.get_topk_transform_method(forward_batch.forward_mode),
                                  topk_backend=self.dsa_topk_backend, force_unfused_topk=not self.use_fused_topk)
