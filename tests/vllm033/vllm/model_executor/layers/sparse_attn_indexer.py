"""vllm/model_executor/layers/sparse_attn_indexer.py: `sparse_attn_indexer`'s prefill loop (l.600-790) with
0.33's locals and calls, `PrefillRowShard` (l.368-406) verbatim, and `SparseAttnIndexer.forward_cuda`
(l.1111-1152) calling the op through `torch.ops.vllm.sparse_attn_indexer` (registered as vLLM's
`direct_register_custom_op` does); the decode branch (l.791-957) for uniform batches, through
`get_indexer_topk(topk_backend)`. Quantization, padded decode, DCP and PCP are left out."""

import sys

import torch
from vllm import _custom_ops as ops
from vllm.distributed import get_tensor_model_parallel_rank, get_tp_group
from vllm.forward_context import get_forward_context
from vllm.model_executor.kernels.attention.dsa.candidate_blocks import (
    apply_candidate_mask as _apply_candidate_mask,
)
from vllm.model_executor.kernels.attention.dsa.candidate_blocks import (
    select_candidate_blocks as _select_candidate_blocks,
)
from vllm.model_executor.layers.indexer_topk import get_indexer_topk
from vllm.utils.deep_gemm import fp8_fp4_mqa_logits, fp8_fp4_paged_mqa_logits


class PrefillRowShard:
    def __init__(self, num_decode_tokens: int, sizes: list[int], rank: int):
        self.num_decode_tokens = num_decode_tokens
        self.sizes = sizes
        self.start = num_decode_tokens + sum(sizes[:rank])
        self.stop = self.start + sizes[rank]

    @classmethod
    def from_metadata(cls, prefill_metadata, num_decode_tokens: int) -> "PrefillRowShard | None":
        sizes = getattr(prefill_metadata, "row_shard_sizes", None)
        if sizes is None:
            return None
        return cls(num_decode_tokens, sizes, get_tensor_model_parallel_rank())

    def narrow(self, chunk) -> "tuple[int, int, torch.Tensor, torch.Tensor] | None":
        start = max(chunk.token_start, self.start)
        end = min(chunk.token_end, self.stop)
        if start >= end:
            return None
        lo, hi = start - chunk.token_start, end - chunk.token_start
        return start, end, chunk.cu_seqlen_ks[lo:hi], chunk.cu_seqlen_ke[lo:hi]

    def exchange_topk(self, topk_buffer: torch.Tensor, width: int) -> None:
        local = topk_buffer[self.start : self.stop, :width].contiguous()
        end = self.num_decode_tokens + sum(self.sizes)
        topk_buffer[self.num_decode_tokens : end, :width] = get_tp_group().all_gatherv(
            local, dim=0, sizes=self.sizes
        )


def sparse_attn_indexer(
    hidden_states: torch.Tensor,
    k_cache_prefix: str,
    kv_cache: torch.Tensor,
    q_quant: torch.Tensor,
    q_scale: torch.Tensor | None,
    k: torch.Tensor | None,
    weights: torch.Tensor,
    quant_block_size: int,
    scale_fmt: str | None,
    topk_tokens: int,
    head_dim: int,
    max_model_len: int,
    total_seq_lens: int,
    topk_indices_buffer: torch.Tensor,
    skip_k_cache_insert: bool,
    use_pcp: bool,
    pcp_shard_decode_requests: bool,
    dense_mha_metadata_layer_name: str,
    use_fp4_cache: bool = False,
    dcp_rank: int = 0,
    dcp_world_size: int = 1,
    cp_kv_cache_interleave_size: int = 1,
    skip_topk_buffer_clear: bool = False,
    candidate_blocks: torch.Tensor | None = None,
    candidate_block_size: int = 0,
    candidate_write: bool = False,
    topk_backend: str = "auto",
) -> torch.Tensor:
    forward_context = get_forward_context()
    attn_metadata = forward_context.attn_metadata
    attn_metadata_narrowed = attn_metadata[k_cache_prefix]
    has_decode = attn_metadata_narrowed.num_decodes > 0
    has_prefill = attn_metadata_narrowed.num_prefills > 0
    num_decode_tokens = attn_metadata_narrowed.num_decode_tokens
    if not skip_topk_buffer_clear:
        topk_indices_buffer[: hidden_states.shape[0]] = -1
    if has_prefill:
        prefill_metadata = attn_metadata_narrowed.prefill
        k_quant_full = torch.empty((total_seq_lens, head_dim), device=kv_cache.device)
        k_scale_full = torch.empty((total_seq_lens, 1), device=kv_cache.device)
        row_shard = (
            None
            if candidate_blocks is not None
            else PrefillRowShard.from_metadata(prefill_metadata, num_decode_tokens)
        )
        for chunk in prefill_metadata.chunks:
            cu_seqlen_ks = chunk.cu_seqlen_ks
            cu_seqlen_ke = chunk.cu_seqlen_ke
            k_quant = k_quant_full[: chunk.max_local_total_seq_lens]
            k_scale = k_scale_full[: chunk.max_local_total_seq_lens]
            if not chunk.skip_kv_gather and chunk.local_total_seq_lens > 0:
                ops.cp_gather_indexer_k_quant_cache(
                    kv_cache, k_quant, k_scale, chunk.block_table, chunk.local_cu_seq_lens
                )
            row_start, row_end = chunk.token_start, chunk.token_end
            if row_shard is not None:
                narrowed = row_shard.narrow(chunk)
                if narrowed is None:
                    continue
                row_start, row_end, cu_seqlen_ks, cu_seqlen_ke = narrowed
            q_slice = q_quant[row_start:row_end]
            q_scale_slice = q_scale[row_start:row_end] if q_scale is not None else None
            topk_indices = topk_indices_buffer[row_start:row_end, :topk_tokens]
            row_starts: torch.Tensor | None = None
            if chunk.local_total_seq_lens == 0 or q_slice.shape[0] == 0:
                logits = q_slice.new_empty((q_slice.shape[0], 0), dtype=torch.float32)
                topk_indices.fill_(-1)
            else:
                chunk_weights = weights[row_start:row_end]
                row_ends = cu_seqlen_ke - cu_seqlen_ks
                logits = fp8_fp4_mqa_logits(
                    (q_slice, q_scale_slice),
                    (k_quant, k_scale),
                    chunk_weights,
                    cu_seqlen_ks,
                    cu_seqlen_ke,
                    chunk.max_seqlen_k,
                )
                num_rows = logits.shape[0]
                if candidate_blocks is not None:
                    chunk_candidates = candidate_blocks[chunk.token_start : chunk.token_end]
                    if candidate_write:
                        _select_candidate_blocks(
                            logits, row_starts, row_ends, chunk_candidates.shape[1],
                            candidate_block_size, chunk_candidates,
                        )
                    else:
                        _apply_candidate_mask(
                            logits, row_starts, row_ends, chunk_candidates, candidate_block_size
                        )
                ops.top_k_per_row_prefill(
                    logits,
                    torch.zeros_like(row_ends) if row_starts is None else row_starts,
                    row_ends,
                    topk_indices,
                    num_rows,
                    logits.stride(0),
                    logits.stride(1),
                    topk_tokens,
                )
        if row_shard is not None:
            row_shard.exchange_topk(topk_indices_buffer, topk_tokens)
    if has_decode:  # l.791-957, for a uniform batch (no padding), without DCP or candidate blocks
        decode_metadata = attn_metadata_narrowed.decode
        assert decode_metadata is not None
        decode_lens = decode_metadata.decode_lens
        padded_q_quant_decode_tokens = q_quant[:num_decode_tokens].reshape(
            decode_lens.shape[0], -1, *q_quant.shape[1:]
        )
        padded_q_scale = None
        batch_size = padded_q_quant_decode_tokens.shape[0]
        next_n = padded_q_quant_decode_tokens.shape[1]
        num_padded_tokens = batch_size * next_n
        seq_lens = decode_metadata.seq_lens[:batch_size]
        logits = fp8_fp4_paged_mqa_logits(
            (padded_q_quant_decode_tokens, padded_q_scale),
            kv_cache,
            weights[:num_padded_tokens],
            seq_lens,
            decode_metadata.block_table,
            decode_metadata.schedule_metadata,
            max_model_len=max_model_len,
            indices=decode_metadata.indices,
        )
        topk_indices = topk_indices_buffer[:num_padded_tokens, :topk_tokens]
        get_indexer_topk(topk_backend)(
            logits,
            seq_lens,
            next_n,
            topk_indices,
            topk_tokens,
            attn_metadata_narrowed.max_seq_len,
        )
    return topk_indices_buffer


SCHEMA = (
    "sparse_attn_indexer(Tensor hidden_states, str k_cache_prefix, Tensor kv_cache, Tensor q_quant, "
    "Tensor? q_scale, Tensor? k, Tensor weights, int quant_block_size, str? scale_fmt, int topk_tokens, "
    "int head_dim, int max_model_len, int total_seq_lens, Tensor(a!) topk_indices_buffer, "
    "bool skip_k_cache_insert, bool use_pcp, bool pcp_shard_decode_requests, "
    "str dense_mha_metadata_layer_name, bool use_fp4_cache=False, int dcp_rank=0, int dcp_world_size=1, "
    "int cp_kv_cache_interleave_size=1, bool skip_topk_buffer_clear=False, Tensor(b!)? candidate_blocks=None, "
    "int candidate_block_size=0, bool candidate_write=False, str topk_backend='auto') -> Tensor"
)
# direct_register_custom_op(op_name="sparse_attn_indexer", op_func=sparse_attn_indexer,
#                           mutates_args=["topk_indices_buffer", "candidate_blocks"]) (l.992-998)
if not hasattr(torch.ops.vllm, "sparse_attn_indexer"):  # once per process
    _lib = torch.library.Library("vllm", "FRAGMENT")
    _lib.define(SCHEMA)
    for _key in ("CPU", "CUDA"):
        # Through the module attribute: the tests import this tree afresh, and each import is current.
        _lib.impl("sparse_attn_indexer",
                  lambda *a, **k: sys.modules[__name__].sparse_attn_indexer(*a, **k), _key)
    torch.ops.vllm._logitreplay_test_lib = _lib


class SparseAttnIndexer(torch.nn.Module):
    def __init__(self, k_cache, quant_block_size, scale_fmt, topk_tokens, head_dim, max_model_len,
                 max_total_seq_len, topk_indices_buffer, skip_k_cache_insert=False, use_fp4_cache=False,
                 compress_ratio=1, candidate_blocks=None, candidate_block_size=0, candidate_write=False):
        super().__init__()
        self.k_cache = k_cache
        self.quant_block_size = quant_block_size
        self.scale_fmt = scale_fmt
        self.topk_tokens = topk_tokens
        self.head_dim = head_dim
        self.max_model_len = max_model_len
        self.max_total_seq_len = max_total_seq_len
        self.topk_indices_buffer = topk_indices_buffer
        self.skip_k_cache_insert = skip_k_cache_insert
        self.use_fp4_cache = use_fp4_cache
        self.compress_ratio = compress_ratio
        self.candidate_blocks = candidate_blocks
        self.candidate_block_size = candidate_block_size
        self.candidate_write = candidate_write
        self.dense_mha_metadata_layer_name = ""
        self.topk_backend = "auto"

    def forward(self, hidden_states, q_quant, k, weights):
        return self.forward_cuda(hidden_states, q_quant, k, weights)

    def forward_cuda(self, hidden_states, q_quant, k, weights):
        if isinstance(q_quant, tuple):
            q_values, q_scale = q_quant
        else:
            q_values, q_scale = q_quant, None
        return torch.ops.vllm.sparse_attn_indexer(
            hidden_states,
            self.k_cache.prefix,
            self.k_cache.kv_cache,
            q_values,
            q_scale,
            k,
            weights,
            self.quant_block_size,
            self.scale_fmt,
            self.topk_tokens,
            self.head_dim,
            self.max_model_len,
            self.max_total_seq_len,
            self.topk_indices_buffer,
            self.skip_k_cache_insert,
            False,
            False,
            self.dense_mha_metadata_layer_name,
            self.use_fp4_cache,
            0,
            1,
            1,
            False,
            candidate_blocks=self.candidate_blocks,
            candidate_block_size=self.candidate_block_size,
            candidate_write=self.candidate_write,
            topk_backend=self.topk_backend,
        )
