"""vllm/_custom_ops.py l.3203-3222: the Python wrapper, with its stale parameter names."""

import torch
import vllm._C_stable_libtorch  # noqa: F401  (vllm/platforms/cuda.py: "trigger op registration")


def top_k_per_row_prefill(
    logits: torch.Tensor,
    cu_seqlen_ks: torch.Tensor,
    cu_seqlen_ke: torch.Tensor,
    raw_topk_indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    topk_tokens: int,
) -> None:
    torch.ops._C.top_k_per_row_prefill(
        logits,
        cu_seqlen_ks,
        cu_seqlen_ke,
        raw_topk_indices,
        num_rows,
        stride0,
        stride1,
        topk_tokens,
    )


def cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
    """Stand-in for the cache-gather op: here `block_table` lists the cache rows of the chunk's keys."""
    dst_k[: block_table.shape[0]] = kv_cache[block_table.long()]
    dst_scale[: block_table.shape[0]] = 1.0


def top_k_per_row_decode(
    logits: torch.Tensor,
    next_n: int,
    seq_lens: torch.Tensor,
    raw_topk_indices: torch.Tensor,
    num_rows: int,
    stride0: int,
    stride1: int,
    topk_tokens: int,
) -> None:
    """vllm/_custom_ops.py l.3225-3244."""
    torch.ops._C.top_k_per_row_decode(
        logits,
        next_n,
        seq_lens,
        raw_topk_indices,
        num_rows,
        stride0,
        stride1,
        topk_tokens,
    )
