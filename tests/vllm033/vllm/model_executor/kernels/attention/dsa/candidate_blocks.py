"""vllm/model_executor/kernels/attention/dsa/candidate_blocks.py l.157-260: two-level selection over
packed logits (torch in place of the Triton kernels), importing deep_select_topk by name as 0.33 does."""

import torch
from vllm.model_executor.kernels.attention.dsa.sparse_mqa_logits import has_deep_select
from vllm.model_executor.layers.indexer_topk import (
    deep_select_topk,
    get_deep_select_stride_requirement,
)


def _block_view(logits, row_ks, row_ke, block_size):
    rows, width = logits.shape
    nblocks = -(-width // block_size)
    cols = torch.arange(width, device=logits.device)
    start = torch.zeros_like(row_ke) if row_ks is None else row_ks
    inside = (cols >= start[:, None].long()) & (cols < row_ke[:, None].long())
    return nblocks, cols, inside


def select_candidate_blocks(logits, row_ks, row_ke, topk_blocks, block_size, out, row_repeat=1):
    """Select local block IDs by maximum score. Row bounds are in packed column space."""
    rows, width = logits.shape
    if not rows:
        return
    nblocks, cols, inside = _block_view(logits, row_ks, row_ke, block_size)
    use_deep_select = has_deep_select() and nblocks >= topk_blocks
    in_align, _ = get_deep_select_stride_requirement()
    padded = -(-nblocks // (in_align // logits.element_size())) * (in_align // logits.element_size())
    scores = logits.new_full((rows, padded), float("-inf"))[:, :nblocks]
    masked = torch.where(inside, logits, float("-inf"))
    pad = nblocks * block_size - width
    scores.copy_(torch.nn.functional.pad(masked, (0, pad), value=float("-inf"))
                 .view(rows, nblocks, block_size).amax(-1))
    valid_blocks = ((row_ke - (0 if row_ks is None else row_ks)) + block_size - 1) // block_size
    valid_blocks = valid_blocks.to(torch.int32)
    if use_deep_select:
        deep_select_topk(scores, topk_blocks, end=valid_blocks, output_idx=out)
        return
    top = scores.topk(min(topk_blocks, nblocks), dim=-1)
    out.copy_(torch.where(top.values > float("-inf"), top.indices, -1).to(out.dtype))


def apply_candidate_mask(logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat=1):
    """Mask packed logits outside causal bounds and request-local candidates (in place, -inf)."""
    rows, width = logits.shape
    if not rows or not width:
        return
    nblocks, cols, inside = _block_view(logits, row_ks, row_ke, block_size)
    flags = torch.zeros((rows, nblocks + 1), dtype=torch.bool, device=logits.device)
    flags.scatter_(1, torch.where(candidate_blocks >= 0, candidate_blocks, nblocks).long(), True)
    keep = flags[:, :nblocks].repeat_interleave(block_size, dim=1, output_size=nblocks * block_size)[:, :width]
    logits.masked_fill_(~(inside & keep), float("-inf"))
