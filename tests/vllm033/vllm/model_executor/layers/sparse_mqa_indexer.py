"""vllm/model_executor/layers/sparse_mqa_indexer.py: `SparseMQAIndexer.forward`'s prefill loop."""

import torch
from torch import nn
from vllm import _custom_ops as ops
from vllm.forward_context import get_forward_context
from vllm.model_executor.kernels.attention.dsa.sparse_mqa_logits import sparse_mqa_logits_prefill_chunk


class SparseChunkRows:
    """The builder-owned scratch of one prefill chunk (DeepseekV41SparseIndexerMetadata.sparse_prefill)."""

    def __init__(self, rows: int, num_sparse: int, topk: int, device):
        self.sparse_indices = torch.empty((rows, num_sparse), dtype=torch.int32, device=device)
        self.end = torch.empty((rows,), dtype=torch.int32, device=device)
        self.col_indices = torch.empty((rows, -(-topk // 8) * 8), dtype=torch.int32, device=device)[:, :topk]
        self.kernel_metadata = None


class SparseMQAIndexer(nn.Module):
    def __init__(self, k_cache, topk_tokens, head_dim, max_total_seq_len, topk_indices_buffer,
                 candidate_blocks, candidate_block_size):
        super().__init__()
        self.k_cache = k_cache
        self.topk_tokens = topk_tokens
        self.head_dim = head_dim
        self.max_total_seq_len = max_total_seq_len
        self.topk_indices_buffer = topk_indices_buffer
        self.candidate_blocks = candidate_blocks
        self.candidate_block_size = candidate_block_size

    def forward(self, hidden_states, q_quant, k, weights):
        attn_metadata = get_forward_context().attn_metadata
        metadata = attn_metadata[self.k_cache.prefix]
        q_values, q_scale = q_quant
        kv_cache = self.k_cache.kv_cache
        topk_tokens = self.topk_tokens
        topk_indices_buffer = self.topk_indices_buffer
        topk_indices_buffer[: hidden_states.shape[0]] = -1
        sparse_block_kv = metadata.sparse_block_kv
        if metadata.num_prefills > 0:
            prefill = metadata.prefill
            sparse_chunks = metadata.sparse_prefill
            k_quant_full = torch.empty((self.max_total_seq_len, self.head_dim), device=kv_cache.device)
            k_scale_full = torch.empty((self.max_total_seq_len, 1), device=kv_cache.device)
            for chunk, rows in zip(prefill.chunks, sparse_chunks):  # noqa: B905  (as in vLLM)
                k_quant = k_quant_full[: chunk.max_local_total_seq_lens]
                k_scale = k_scale_full[: chunk.max_local_total_seq_lens]
                if not chunk.skip_kv_gather and chunk.local_total_seq_lens > 0:
                    ops.cp_gather_indexer_k_quant_cache(kv_cache, k_quant, k_scale, chunk.block_table,
                                                        chunk.local_cu_seq_lens)
                if chunk.local_total_seq_lens == 0:
                    continue
                start, end = chunk.token_start, chunk.token_end
                rows.kernel_metadata = sparse_mqa_logits_prefill_chunk(
                    q_values[start:end],
                    q_scale[start:end],
                    k_quant,
                    k_scale,
                    weights[start:end],
                    chunk.cu_seqlen_ks,
                    chunk.cu_seqlen_ke,
                    self.candidate_blocks[start:end],
                    self.candidate_block_size,
                    sparse_block_kv,
                    topk_tokens,
                    topk_indices_buffer[start:end, :topk_tokens],
                    sparse_indices=rows.sparse_indices,
                    end=rows.end,
                    col_indices=rows.col_indices,
                    kernel_metadata=rows.kernel_metadata,
                )
        return topk_indices_buffer
