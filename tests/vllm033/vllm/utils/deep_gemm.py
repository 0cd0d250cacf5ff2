"""vllm/utils/deep_gemm.py l.638-681 stand-ins: DeepGEMM's MQA logits, with the layout it returns."""

import torch

ROW_ALIGN = 32  # DeepGEMM pads the row stride: stride(0) may exceed max_seqlen_k
GARBAGE = (float("nan"), 3e38)


def _scores(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_h w[i, h] * relu(q[i, h] . k): (rows, H, D) x (rows, W, D) -> (rows, W), float32."""
    dots = torch.einsum("rhd,rwd->rhw", q.float(), keys.float()).relu()
    return torch.einsum("rhw,rh->rw", dots, weights.float())


def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k):
    """Compressed logits of shape [M, max_seqlen_k]: row i holds K positions [ks[i], ke[i]) starting at
    column zero, and the tail is not cleaned (here: NaN and 3e38, as uninitialized memory may hold)."""
    (q_values, _), (k_quant, _) = q, kv
    rows = q_values.shape[0]
    stride = -(-max_seqlen_k // ROW_ALIGN) * ROW_ALIGN
    out = torch.full((rows, stride), GARBAGE[0], device=q_values.device)
    out[:, ::3] = GARBAGE[1]
    cols = torch.arange(max_seqlen_k, device=q_values.device)
    key_rows = (cu_seqlen_ks[:, None].long() + cols).clamp(max=k_quant.shape[0] - 1)
    scores = _scores(q_values, k_quant[key_rows], weights)
    inside = cols < (cu_seqlen_ke - cu_seqlen_ks)[:, None]
    out[:, :max_seqlen_k] = torch.where(inside, scores, out[:, :max_seqlen_k])
    return out[:, :max_seqlen_k]


def fp8_fp4_sparse_mqa_logits(q, kv, weights, key_rows, num_sparse_cols, sparse_block_kv):
    """Sparse logits: bf16, contiguous [rows, num_sparse_cols], column j scoring key row key_rows[:, j]."""
    (q_values, _), (k_quant, _) = q, kv
    keys = k_quant[key_rows.long().clamp(0, k_quant.shape[0] - 1)]
    return _scores(q_values, keys, weights).to(torch.bfloat16).contiguous()


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule_metadata,
                             max_model_len, indices=None):
    """l.738-777: decode logits of shape [B * next_n, max_model_len] (contiguous); columns past each row's
    context length are not cleaned. `context_lens` is (B, next_n) per-row or (B, 1); here `block_tables`
    lists, per request, the cache rows of its key positions."""
    q_values, _ = q
    batch, next_n = q_values.shape[:2]
    rows = batch * next_n
    lens = context_lens.reshape(batch, -1)
    if lens.shape[1] != next_n:  # (B, 1): row j of a request ends at seq_len - next_n + 1 + j
        lens = (lens - next_n + 1 + torch.arange(next_n, device=lens.device)).clamp(min=0)
    out = torch.full((rows, max_model_len), GARBAGE[0], device=q_values.device)
    out[:, ::3] = GARBAGE[1]
    width = block_tables.shape[1]
    keys = kv_cache[block_tables.long().clamp(0, kv_cache.shape[0] - 1)]  # (B, width, D)
    scores = _scores(q_values.reshape(rows, *q_values.shape[2:]), keys.repeat_interleave(next_n, dim=0), weights)
    inside = torch.arange(width, device=out.device) < lens.reshape(rows, 1)
    out[:, :width] = torch.where(inside, scores, out[:, :width])
    return out
