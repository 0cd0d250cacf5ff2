"""vllm/model_executor/kernels/attention/dsa/sparse_mqa_logits.py: the V4.1 sparse-logits path. Imports
deep_select_topk by name (l.26-29) and calls it in sparse_topk_remap (l.256-309) on bf16 logits."""

import torch
from vllm.model_executor.layers.indexer_topk import (
    deep_select_topk,
    get_deep_select_stride_requirement,  # noqa: F401
)
from vllm.utils.deep_gemm import fp8_fp4_sparse_mqa_logits


def has_deep_select() -> bool:
    return True


def candidate_blocks_to_sparse_indices(candidate_blocks, row_ks, row_ke, candidate_block_size,
                                       sparse_block_kv, out=None):
    """Candidate blocks -> sorted sparse block ids (valid prefix first, padded with the last valid one) and
    each row's count of valid sparse-token columns."""
    rows, k = candidate_blocks.shape
    ratio = candidate_block_size // sparse_block_kv
    cand = candidate_blocks.long()
    if ratio == 2:
        cand = torch.stack([cand * 2, cand * 2 + 1], dim=-1).reshape(rows, 2 * k)
    kv_len = (row_ke - row_ks).clamp(min=0).long()
    max_block = (kv_len + sparse_block_kv - 1) // sparse_block_kv
    valid = (cand >= 0) & (cand < max_block[:, None])
    big = 2**31 - 1
    vals = torch.where(valid, cand, big).sort(dim=1).values
    n_valid = valid.sum(1)
    base = row_ks.long() // sparse_block_kv
    last = torch.where(valid, cand, -1).amax(1)
    pad = torch.where(n_valid > 0, last + base, base)
    si = torch.where(torch.arange(vals.shape[1], device=vals.device) < n_valid[:, None],
                     torch.where(vals != big, vals, 0) + base[:, None], pad[:, None])
    last_start = last * sparse_block_kv + row_ks.long()
    fill = (row_ke.long() - last_start).clamp(1, sparse_block_kv)
    end = torch.where(n_valid > 0, (n_valid - 1) * sparse_block_kv + fill, 0)
    sparse_indices, end_out = out
    sparse_indices.copy_(si.to(torch.int32))
    end_out.copy_(end.to(torch.int32))
    return sparse_indices, end_out


def sparse_topk_remap(logits, sparse_indices, end, row_ks, sparse_block_kv, topk_tokens, topk_indices, *,
                      col_indices):
    """Row top-k over sparse logits, remapped to request-local positions."""
    rows, width = logits.shape
    assert logits.dtype == torch.bfloat16 and width >= topk_tokens
    assert end.dtype == torch.int32 and end.shape == (rows,)
    cols = col_indices[:rows]
    deep_select_topk(logits, topk_tokens, end=end, output_idx=cols)
    c = cols.long()
    valid = (c >= 0) & (c < width)
    cc = torch.where(valid, c, 0)
    blocks = sparse_indices.long().gather(1, cc // sparse_block_kv)
    pos = (blocks - (row_ks.long() // sparse_block_kv)[:, None]) * sparse_block_kv + cc % sparse_block_kv
    topk_indices[:rows, :topk_tokens] = torch.where(valid, pos, -1).to(torch.int32)


def sparse_mqa_logits_prefill_chunk(q, q_scale, k_quant, k_scale, weights, cu_seqlen_ks, cu_seqlen_ke,
                                    candidate_blocks, candidate_block_size, sparse_block_kv, topk_tokens,
                                    topk_indices, *, sparse_indices, end, col_indices, kernel_metadata=None):
    """Sparse-MQA logits + top-k for one prefill chunk (packed KV workspace)."""
    if kernel_metadata is None:
        candidate_blocks_to_sparse_indices(candidate_blocks, cu_seqlen_ks, cu_seqlen_ke, candidate_block_size,
                                           sparse_block_kv, out=(sparse_indices, end))
        offs = torch.arange(sparse_block_kv, device=q.device)
        kernel_metadata = (sparse_indices.long()[:, :, None] * sparse_block_kv
                           + (cu_seqlen_ks.long() % sparse_block_kv)[:, None, None] + offs).flatten(1)
    logits = fp8_fp4_sparse_mqa_logits((q, q_scale), (k_quant, k_scale), weights, kernel_metadata,
                                       sparse_indices.shape[1], sparse_block_kv)
    sparse_topk_remap(logits, sparse_indices, end, cu_seqlen_ks, sparse_block_kv, topk_tokens, topk_indices,
                      col_indices=col_indices)
    return kernel_metadata
