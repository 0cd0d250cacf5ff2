"""Registers `torch.ops._C.top_k_per_row_prefill` with vLLM 0.33's exact schema (what the real .so
registers through STABLE_TORCH_LIBRARY_FRAGMENT(_C, ...)), backed by a torch kernel with its contract."""

import torch

from tests.vllm_schemas import SCHEMAS_C

SCHEMA = SCHEMAS_C["top_k_per_row_prefill"]


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


# The decode top-k ops (vllm/model_executor/layers/indexer_topk.py's backends), with 0.33's schemas.
DECODE_SCHEMAS = {name: SCHEMAS_C[name] for name in ("top_k_per_row_decode", "persistent_topk", "cooperative_topk")}


def _decode_rows(logits, row_ends, out, k):
    """Row r: the top-k columns of [0, row_ends[r]), -1 tails (no host sync: it runs in CUDA graphs)."""
    cols = torch.arange(logits.shape[1], device=logits.device)
    valid = cols < row_ends[:, None].long()
    kk = min(k, logits.shape[1])
    top = torch.where(valid, logits, float("-inf")).topk(kk, dim=1).indices
    out[:, :kk] = torch.where(valid.gather(1, top), top, -1).to(torch.int32)
    out[:, kk:k] = -1


def top_k_per_row_decode_kernel(logits, next_n, seq_lens, indices, numRows, stride0, stride1, topK):
    """The per-row kernel's rowEnd = seqLens[row / next_n] - next_n + row % next_n + 1 ((batch, 1) lens),
    or the per-row lens themselves ((batch, next_n))."""
    view = logits.as_strided((numRows, logits.shape[1]), (stride0, stride1))
    lens = seq_lens.reshape(-1)
    if lens.numel() == numRows:
        ends = lens
    else:
        ends = (lens.repeat_interleave(next_n, output_size=numRows) - next_n + 1
                + torch.arange(next_n, device=lens.device).repeat(numRows // next_n)).clamp(min=0)
    _decode_rows(view, ends, indices[:numRows], topK)


def radix_topk_kernel(logits, lengths, output, workspace, k, max_seq_len):
    """persistent_topk / cooperative_topk: one length per row (lengths.numel() == rows), clamped to
    max_seq_len; the workspace is vLLM's 1 MiB uint8 buffer."""
    assert workspace.dtype == torch.uint8 and lengths.dtype == torch.int32
    _decode_rows(logits, lengths.reshape(-1).clamp(max=max_seq_len), output, k)


if not hasattr(torch.ops._C, "top_k_per_row_decode"):
    _decode_lib = torch.library.Library("_C", "FRAGMENT")
    for _name, _schema in DECODE_SCHEMAS.items():
        _decode_lib.define(_schema)
        _kernel = top_k_per_row_decode_kernel if _name == "top_k_per_row_decode" else radix_topk_kernel
        for _key in ("CPU", "CUDA"):
            _decode_lib.impl(_name, _kernel, _key)
    torch.ops._C._logitreplay_decode_test_lib = _decode_lib
