"""vllm/models/deepseek_v41/attention.py: the V4.1 topology (l.313-490) and the call of the indexer op in
`_sparse_indexer_and_attn` (l.1035-1056). Non-owning index sources share the kv source's index K cache,
so the op's `k_cache_prefix` names another layer."""

import re

import torch
from torch import nn
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.model_executor.layers.sparse_mqa_indexer import SparseMQAIndexer


def _replace_layer_index(prefix: str, layer_id: int) -> str:
    new_prefix, n = re.subn(r"\.layers\.\d+\.", f".layers.{layer_id}.", prefix)
    assert n == 1
    return new_prefix


class DeepseekV4IndexerCache(nn.Module):
    def __init__(self, prefix: str, kv_cache: torch.Tensor, compress_ratio: int):
        super().__init__()
        self.prefix = prefix
        self.kv_cache = kv_cache
        self.compress_ratio = compress_ratio


class DeepseekV4Indexer(nn.Module):
    def __init__(self, *, topk_tokens, head_dim, max_total_seq_len, topk_indices_buffer, compress_ratio,
                 prefix, k_cache, candidate_block_buffer=None, candidate_block_size=0, candidate_write=False,
                 indexer_sparse_logits=False):
        super().__init__()
        self.topk_tokens = topk_tokens
        self.topk_indices_buffer = topk_indices_buffer
        self.compress_ratio = compress_ratio
        self.prefix = prefix
        self.k_cache = k_cache
        use_sparse_logits = indexer_sparse_logits and candidate_block_buffer is not None and not candidate_write
        if use_sparse_logits:
            self.indexer_op = SparseMQAIndexer(k_cache, topk_tokens, head_dim, max_total_seq_len,
                                               topk_indices_buffer, candidate_block_buffer, candidate_block_size)
        else:
            self.indexer_op = SparseAttnIndexer(k_cache, 128, "ue8m0", topk_tokens, head_dim, 1 << 20,
                                                max_total_seq_len, topk_indices_buffer, skip_k_cache_insert=True,
                                                compress_ratio=compress_ratio, candidate_blocks=candidate_block_buffer,
                                                candidate_block_size=candidate_block_size,
                                                candidate_write=candidate_write)


class DeepseekV41Attention(nn.Module):
    def __init__(self, prefix: str, layer_id: int, config, static_forward_context: dict, topk_indices_buffer,
                 candidate_block_buffer, kv_cache: torch.Tensor):
        super().__init__()
        self.prefix = prefix
        self.layer_id = layer_id
        self.compress_ratio = int(config.compress_ratios[layer_id])
        self.kv_source_layers = tuple(config.kv_source_layer_ids)
        self.index_source_layers = tuple(config.index_source_layer_ids)
        self.candidate_source_layer = config.candidate_source_layer_id
        self.candidate_block_size = config.candidate_block_size
        self.is_kv_source = layer_id in self.kv_source_layers
        self.is_index_source = layer_id in self.index_source_layers
        self.kv_source_layer_id = max(s for s in self.kv_source_layers if s <= layer_id)
        static_forward_context[prefix] = self
        self.indexer = None
        if self.is_index_source:
            if self.is_kv_source:
                index_k_cache = DeepseekV4IndexerCache(f"{prefix}.indexer.k_cache", kv_cache, self.compress_ratio)
                static_forward_context[index_k_cache.prefix] = index_k_cache
            else:
                k_cache_prefix = f"{_replace_layer_index(prefix, self.kv_source_layer_id)}.indexer.k_cache"
                index_k_cache = static_forward_context[k_cache_prefix]
            is_candidate_source = layer_id == self.candidate_source_layer
            uses_candidates = 0 <= self.candidate_source_layer < layer_id
            self.indexer = DeepseekV4Indexer(
                topk_tokens=config.index_topk, head_dim=kv_cache.shape[1], max_total_seq_len=kv_cache.shape[0],
                topk_indices_buffer=topk_indices_buffer, compress_ratio=self.compress_ratio,
                prefix=f"{prefix}.indexer", k_cache=index_k_cache,
                candidate_block_buffer=candidate_block_buffer if (is_candidate_source or uses_candidates) else None,
                candidate_block_size=self.candidate_block_size, candidate_write=is_candidate_source,
                indexer_sparse_logits=config.indexer_sparse_logits)

    def _sparse_indexer_and_attn(self, hidden_states, index_q, index_q_scale, index_weights):
        if self.indexer is not None and index_q is not None:
            q_quant = (index_q, index_q_scale) if index_q_scale is not None else index_q
            self.indexer.indexer_op(
                hidden_states,
                q_quant,
                None,
                index_weights,
            )
