"""Registers `torch.ops._C.top_k_per_row_prefill` with vLLM 0.33's exact schema (what the real .so
registers through STABLE_TORCH_LIBRARY_FRAGMENT(_C, ...)), backed by a torch kernel with its contract."""

import torch

SCHEMA = ("top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor rowEnds, Tensor! indices, "
          "int numRows, int stride0, int stride1, int topK) -> ()")


def top_k_per_row_prefill_kernel(logits, rowStarts, rowEnds, indices, numRows, stride0, stride1, topK):
    """Row r: the top-k columns in [rowStarts[r], rowEnds[r]) relative to rowStarts[r], -1 tails. Reads the
    rows through (stride0, stride1) as the CUDA kernel does; no host syncs (it also runs in CUDA graphs)."""
    view = logits.as_strided((numRows, logits.shape[1]), (stride0, stride1))
    cols = torch.arange(view.shape[1], device=view.device)
    ks, ke = rowStarts[:numRows, None].long(), rowEnds[:numRows, None].long()
    valid = (cols >= ks) & (cols < ke)
    k = min(topK, view.shape[1])
    top = torch.where(valid, view, float("-inf")).topk(k, dim=1).indices
    rel = torch.where(valid.gather(1, top), top - ks, -1)
    indices[:numRows, :k] = rel.to(torch.int32)
    indices[:numRows, k:topK] = -1


# Registered once per process: the tests import this tree again after dropping it from sys.modules.
if not hasattr(torch.ops._C, "top_k_per_row_prefill"):
    _lib = torch.library.Library("_C", "FRAGMENT")
    _lib.define(SCHEMA)
    _lib.impl("top_k_per_row_prefill", top_k_per_row_prefill_kernel, "CPU")
    _lib.impl("top_k_per_row_prefill", top_k_per_row_prefill_kernel, "CUDA")
    torch.ops._C._logitreplay_test_lib = _lib
