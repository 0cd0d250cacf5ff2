"""`Indexer`, the DSA indexer of DeepSeek V3.2 / GLM-5 in SGLang 0.5.23, reduced to its top-k call site:
`forward_cuda` dispatches decode, target-verify and draft-extend-v2 batches to `_get_topk_paged` and extend
batches to `_get_topk_ragged`, which compute the logits (torch here, DeepGEMM upstream; no cleaning, so the
cells outside each row's window are whatever the buffer held) and call
`metadata.topk_transform(logits, self.index_topk, ...)` with the locals of the real functions. The ragged
path chunks its rows when the logits exceed the budget, as upstream does."""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import BaseIndexerMetadata
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.forward_context import get_token_to_kv_pool


def _unclean(rows: int, cols: int, device: torch.device) -> torch.Tensor:
    """A (rows, cols) float32 view with a padded row stride, filled with what an uninitialized buffer may hold
    (NaN, huge, infinite), by fills only: capturable in a CUDA graph."""
    stride = (cols + 8 + 3) // 4 * 4
    buf = torch.full((rows, stride), float("nan"), device=device)
    buf[:, 1::3] = 3.0e38
    buf[:, 2::5] = float("inf")
    return buf[:, :cols]


def _scores(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_h relu(q[r, h] . k[j]) * w[r, h]: (rows, heads, dim) x (rows or 1, cols, dim) -> (rows, cols)."""
    return (torch.relu(torch.einsum("rhd,rjd->rhj", q, keys)) * weights[:, :, None]).sum(1)


def mqa_logits_should_chunk(num_rows: int, num_cols: int, get_budget_bytes: Any, rocm: bool = False
                            ) -> tuple[bool, int]:
    budget = int(get_budget_bytes())
    return num_rows * num_cols * 4 > budget, budget


class Indexer(torch.nn.Module):
    _MQA_LOGITS_BYTES_PER_ELEM = 4

    def __init__(self, hidden_size: int, index_n_heads: int, index_head_dim: int, rope_head_dim: int,
                 index_topk: int, q_lora_rank: int, max_position_embeddings: int, rope_theta: float,
                 layer_id: int, scale_fmt: str | None, block_size: int = 128, rope_scaling: Any = None,
                 is_neox_style: bool = True, prefix: str = "", quant_config: Any = None,
                 alt_stream: Any = None, config: Any = None) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.n_heads = index_n_heads
        self.head_dim = index_head_dim
        self.index_topk = index_topk
        self.q_lora_rank = q_lora_rank
        self.layer_id = layer_id
        self.num_init_tokens = 0
        self.num_local_tokens = 0
        self.wq_b = torch.nn.Linear(q_lora_rank, index_n_heads * index_head_dim, bias=False)
        self.weights_proj = torch.nn.Linear(hidden_size, index_n_heads, bias=False)
        self.mqa_logits_budget_bytes = 1 << 40

    def _get_mqa_logits_budget_bytes(self, device_index: int | None) -> int:
        return self.mqa_logits_budget_bytes

    def _mask_init_and_local_tokens(self, logits: torch.Tensor, lengths: torch.Tensor,
                                    row_starts: torch.Tensor | None = None) -> torch.Tensor:
        return logits  # num_init_tokens == num_local_tokens == 0: DeepSeek V3.2's configuration

    def forward_cuda(self, x: torch.Tensor, q_lora: torch.Tensor, positions: torch.Tensor,
                     forward_batch: ForwardBatch, layer_id: int) -> torch.Tensor:
        metadata = forward_batch.attn_backend.get_indexer_metadata(layer_id, forward_batch)
        q_fp8 = self.wq_b(q_lora).view(-1, self.n_heads, self.head_dim)
        weights = self.weights_proj(x).unsqueeze(-1)
        if (forward_batch.forward_mode.is_decode_or_idle() or forward_batch.forward_mode.is_target_verify()
                or forward_batch.forward_mode.is_draft_extend_v2()):
            return self._get_topk_paged(forward_batch, layer_id, q_fp8, weights, metadata)
        return self._get_topk_ragged(False, forward_batch, layer_id, q_fp8, weights, metadata)

    forward = forward_cuda

    def _get_topk_paged(self, forward_batch: ForwardBatch, layer_id: int, q_fp8: torch.Tensor,
                        weights: torch.Tensor, metadata: BaseIndexerMetadata) -> torch.Tensor:
        page_size = get_token_to_kv_pool().index_page_size
        block_tables = metadata.get_page_table_64()
        max_seq_len = block_tables.shape[1] * page_size
        kv_cache_fp8 = get_token_to_kv_pool().index_k[layer_id]
        if forward_batch.forward_mode.is_target_verify() or forward_batch.forward_mode.is_draft_extend_v2():
            seqlens_32 = metadata.get_seqlens_expanded()
        else:
            seqlens_32 = metadata.get_seqlens_int32()
        q_offset = sum(metadata.get_dsa_extend_len_cpu())
        B = metadata.get_seqlens_int32().shape[0]
        next_n = q_offset // B if B > 0 else 0
        weights = weights.squeeze(2)
        # the keys of column j of request b: slot page_table[b, j // page_size] * page_size + j % page_size
        col = torch.arange(max_seq_len, device=q_fp8.device)
        slots = block_tables[:, col // page_size].to(torch.int64) * page_size + col % page_size
        keys = kv_cache_fp8[slots]  # one page-table row per request, or per query row (target verify)
        if keys.shape[0] != q_offset:
            keys = keys.repeat_interleave(next_n, dim=0, output_size=q_offset)
        lengths = metadata.get_seqlens_expanded()
        logits = _unclean(q_offset, max_seq_len, q_fp8.device)
        logits.copy_(torch.where(col[None, :] < lengths[:, None], _scores(q_fp8[:q_offset], keys,
                                                                         weights[:q_offset]), logits))
        self._mask_init_and_local_tokens(logits, seqlens_32)
        topk_result = metadata.topk_transform(logits, self.index_topk)
        return topk_result

    def _get_topk_ragged(self, enable_dual_stream: bool, forward_batch: ForwardBatch, layer_id: int,
                         q_fp8: torch.Tensor, weights: torch.Tensor, metadata: BaseIndexerMetadata,
                         topk_result: torch.Tensor | None = None) -> torch.Tensor:
        assert forward_batch.forward_mode.is_extend_without_speculative()
        weights = weights.squeeze(-1)
        block_tables = metadata.get_logical_page_table()
        batch_size = len(block_tables)
        token_nums, _, _ = q_fp8.shape
        device = q_fp8.device
        device_index = device.index
        if topk_result is None:
            topk_result = torch.full((token_nums, self.index_topk), -1, device=device, dtype=torch.int32)
        if batch_size == 0:
            return topk_result
        ks, ke = metadata.get_indexer_kvcache_range()
        indexer_seq_lens_cpu = metadata.get_indexer_seq_len_cpu()
        seq_len_sum = int(torch.sum(indexer_seq_lens_cpu))
        max_seq_len = int(torch.max(indexer_seq_lens_cpu))
        k_fp8 = get_token_to_kv_pool().get_index_k_scale_buffer(
            layer_id, metadata.get_indexer_seq_len(), block_tables, seq_len_sum, max_seq_len)
        seq_lens_expanded = metadata.get_seqlens_expanded()
        token_to_batch_idx = metadata.get_token_to_batch_idx()
        q_offset = ks.shape[0]
        k_offset = k_fp8.shape[0]
        need_chunk, logits_budget_bytes = mqa_logits_should_chunk(
            num_rows=q_offset, num_cols=k_offset,
            get_budget_bytes=lambda: self._get_mqa_logits_budget_bytes(device_index))

        def fp8_mqa_logits(q: torch.Tensor, w: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor) -> torch.Tensor:
            col = torch.arange(k_offset, device=device)[None, :]
            logits = _unclean(q.shape[0], k_offset, device)
            inside = (col >= ks[:, None]) & (col < ke[:, None])
            return logits.copy_(torch.where(inside, _scores(q, k_fp8[None], w), logits))

        if not need_chunk:
            logits = fp8_mqa_logits(q_fp8[:q_offset], weights[:q_offset], ks, ke)
            self._mask_init_and_local_tokens(logits, seq_lens_expanded, ks)
            raw_topk_result = metadata.topk_transform(logits, self.index_topk, ks=ks)
            topk_result[:q_offset] = raw_topk_result
            return topk_result

        bytes_per_row = k_offset * self._MQA_LOGITS_BYTES_PER_ELEM
        max_rows = max(1, int(logits_budget_bytes // max(bytes_per_row, 1)))
        max_rows = min(max_rows, q_offset)
        global_topk_offset = metadata.attn_metadata.topk_indices_offset  # type: ignore[attr-defined]
        cu_seqlens_q_full = None
        if global_topk_offset is None:
            cu_seqlens_q_full = torch.ones(q_offset, dtype=torch.int32, device=device)
        start = 0
        while start < q_offset:
            end = min(start + max_rows, q_offset)
            logits_chunk = fp8_mqa_logits(q_fp8[start:end], weights[start:end], ks[start:end], ke[start:end])
            lengths_chunk = seq_lens_expanded[start:end]
            self._mask_init_and_local_tokens(logits_chunk, lengths_chunk, ks[start:end])
            if global_topk_offset is not None:
                topk_offset_chunk = global_topk_offset[start:end]
                cu_seqlens_q_chunk = None
                batch_idx_chunk = None
            else:
                assert cu_seqlens_q_full is not None and token_to_batch_idx is not None
                topk_offset_chunk = None
                cu_seqlens_q_chunk = cu_seqlens_q_full[start:end]
                batch_idx_chunk = token_to_batch_idx[start:end]
            raw_topk_chunk = metadata.topk_transform(
                logits_chunk, self.index_topk, ks=ks[start:end], cu_seqlens_q=cu_seqlens_q_chunk,
                ke_offset=lengths_chunk, batch_idx_list=batch_idx_chunk,
                topk_indices_offset_override=topk_offset_chunk)
            topk_result[start:end] = raw_topk_chunk
            start = end
        return topk_result
