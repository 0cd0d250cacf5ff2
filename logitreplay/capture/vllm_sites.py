"""The vLLM 0.33 call sites the capture plugin intercepts (`SITES`), and how each call is read.

A `Site` names the attribute to wrap and where to find it; its `read` turns one production call's
arguments (positional exactly as vLLM passes them), its result and the calling frames (`vllm_frames`)
into a `Call`: the tensors as the kernel saw them, still on the device, and the facts a case records.
Reading never syncs with the device. `vllm_plugin` wraps the sites and stages the calls.
"""

from __future__ import annotations

import importlib
import logging
import sys
from types import FrameType
from typing import Any

import torch

from logitreplay.capture import vllm_frames
from logitreplay.capture.frames import find_frame
from logitreplay.capture.sites import Call, Site

log = logging.getLogger("logitreplay.capture")

OP_NAME = "top_k_per_row_prefill"
DECODE_OP = "top_k_per_row_decode"
DECODE_FORWARD = "forward"  # of SparseIndexerTopk
DEEP_SELECT = "deep_select_topk"
_DEEP_SELECT_BINDERS = ("vllm.model_executor.kernels.attention.dsa.sparse_mqa_logits",
                        "vllm.model_executor.kernels.attention.dsa.candidate_blocks")


def _check_strides(logits: torch.Tensor, stride0: Any, stride1: Any) -> None:
    """The op reads rows through (stride0, stride1): they must be the view's own, so the case records the
    layout the kernel really read."""
    if int(stride1) != 1 or logits.stride(1) != 1 or logits.stride(0) != int(stride0):
        raise RuntimeError(f"logits {tuple(logits.shape)} strides {logits.stride()} do not match "
                           f"stride0={stride0}, stride1={stride1}")


def _read_prefill(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                  frame: FrameType | None) -> Call | None:
    """`top_k_per_row_prefill(logits, rowStarts, rowEnds, indices, numRows, stride0, stride1, topK)`,
    positional as `sparse_attn_indexer` passes it."""
    if len(args) != 8 or kwargs:
        return None
    logits, row_starts, row_ends, indices, num_rows, stride0, stride1, top_k = args
    rows, top_k = int(num_rows), int(top_k)
    _check_strides(logits, stride0, stride1)
    facts = vllm_frames.prefill_call(frame)
    if facts is None:  # not called by sparse_attn_indexer: only the arguments are known
        return Call(logits[:rows], row_starts[:rows], row_ends[:rows], indices[:rows, :top_k], top_k,
                    int(stride0), vllm_frames.calling_layer(frame, None), None, None, {"chunk": {}})
    ks = facts.key_offsets
    attrs: dict[str, Any] = {**facts.layer.attrs(), "logits_kind": "mqa_logits", "chunk": facts.chunk_attrs(),
                             "reference_source": f"indices written by vLLM {OP_NAME}"}
    if facts.candidate:
        attrs["candidate"] = facts.candidate
    return Call(logits[:rows], row_starts[:rows], row_ends[:rows], indices[:rows, :top_k], top_k, int(stride0),
                facts.layer, facts.num_reqs if facts.whole_chunk else None,
                ks[:rows] if ks is not None and ks.shape[0] >= rows else None, attrs, facts.shard,
                None if facts.shard is None else (facts.row_start, facts.row_end))


def _read_deep_select(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                      frame: FrameType | None) -> Call | None:
    """`deep_select_topk(input, topk, end=None, output_idx=None, indices_dtype=int32) -> indices`."""
    facts = vllm_frames.selection_call(frame)
    if facts is None or not args or not isinstance(result, torch.Tensor):
        return None
    logits = args[0]
    top_k = int(args[1] if len(args) > 1 else kwargs["topk"])
    end = args[2] if len(args) > 2 else kwargs.get("end")
    rows, cols = (int(n) for n in logits.shape)
    ends = end if end is not None else torch.full((rows,), cols, dtype=torch.int32, device=logits.device)
    ks = facts.key_offsets
    attrs = {**facts.layer.attrs(), "logits_kind": facts.kind, "chunk": facts.chunk, **facts.details,
             "reference_source": f"indices written by vLLM {DEEP_SELECT} (DeepSelect)"}
    if facts.kind == "sparse_mqa_logits":
        attrs["sparse_logits"] = {"dtype": "bfloat16", "columns": "candidate tokens only: column j * "
                                  "sparse_block_kv + o scores sparse block sparse_indices[row, j]"}
    return Call(logits, torch.zeros_like(ends), ends, result[:rows, :top_k], top_k, int(logits.stride(0)),
                facts.layer, facts.num_reqs, ks if ks is not None and ks.shape[0] == rows else None, attrs)


def _read_decode(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                 frame: FrameType | None) -> Call | None:
    """`SparseIndexerTopk.forward(self, logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len)`,
    positional as `sparse_attn_indexer` calls it; the backend is the one `forward` resolved."""
    if len(args) != 7 or kwargs:
        return None
    module, logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len = args
    backend = str(module.resolve_backend(logits, int(topk_tokens), int(logits.shape[0])))
    return _decode_call(logits, seq_lens, int(next_n), topk_indices, int(topk_tokens), int(max_seq_len), backend,
                        frame, f"SparseIndexerTopk ({backend})")


def _read_decode_op(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                    frame: FrameType | None) -> Call | None:
    """`top_k_per_row_decode(logits, next_n, seq_lens, indices, numRows, stride0, stride1, topK)`."""
    if len(args) != 8 or kwargs:
        return None
    logits, next_n, seq_lens, indices, num_rows, stride0, stride1, top_k = args
    _check_strides(logits, stride0, stride1)
    rows = int(num_rows)
    return _decode_call(logits[:rows], seq_lens, int(next_n), indices[:rows], int(top_k), None, "per_row", frame,
                        DECODE_OP)


def _decode_call(logits: torch.Tensor, seq_lens: torch.Tensor, next_n: int, indices: torch.Tensor, top_k: int,
                 max_seq_len: int | None, backend: str, frame: FrameType | None, writer: str) -> Call | None:
    """A decode call as a `Call`: row ends by `SparseIndexerTopk._row_ends` (device ops, no sync), the
    facts the shapes tell, the layer from the frames."""
    rows = int(logits.shape[0])
    per_row = seq_lens.numel() == rows  # (batch, next_n) per-row lengths, or next_n == 1
    if per_row:
        ends = seq_lens.reshape(-1)
    else:
        offsets = torch.arange(next_n, dtype=seq_lens.dtype, device=seq_lens.device)
        ends = (seq_lens.reshape(-1, 1) - next_n + 1 + offsets).clamp(min=0).reshape(-1)
    f = find_frame(frame, local="k_cache_prefix")
    prefix = f.f_locals.get("k_cache_prefix") if f is not None else None
    layer = vllm_frames.calling_layer(f.f_back if f is not None else frame,
                                      prefix if isinstance(prefix, str) else None)
    attrs: dict[str, Any] = {
        **layer.attrs(), "logits_kind": "paged_mqa_logits", "chunk": {},
        "kind": "decode", "decode": {"next_n": next_n, "per_row": per_row, "max_model_len": int(logits.shape[1]),
                                     "max_seq_len": max_seq_len, "backend": backend, "speculative": next_n > 1},
        "reference_source": f"indices written by vLLM {writer}"}
    return Call(logits, torch.zeros_like(ends), ends, indices[:rows, :top_k], top_k, int(logits.stride(0)), layer,
                rows // next_n, None, attrs)


def _decode_targets() -> list[Any]:
    try:
        return [importlib.import_module("vllm.model_executor.layers.indexer_topk").SparseIndexerTopk]
    except Exception as e:  # an older vLLM: the op site may still be there
        log.debug("logitreplay capture: no SparseIndexerTopk: %s", e)
        return []


def _prefill_targets() -> list[Any]:
    import vllm._custom_ops as ops

    return [ops, torch.ops._C]


def _deep_select_targets() -> list[Any]:
    """The defining module (patched before its importers bind the name, they bind the wrapper) and the
    importers already loaded."""
    try:
        defining = [importlib.import_module("vllm.model_executor.layers.indexer_topk")]
    except Exception as e:  # an old vLLM, or a platform without it: the prefill site still works
        log.debug("logitreplay capture: no %s: %s", DEEP_SELECT, e)
        defining = []
    return defining + [sys.modules[m] for m in _DEEP_SELECT_BINDERS if m in sys.modules]


SITES: tuple[Site, ...] = (
    Site(OP_NAME, _prefill_targets, _read_prefill, f"input of vLLM {OP_NAME}"),
    Site(DEEP_SELECT, _deep_select_targets, _read_deep_select, f"input of vLLM {DEEP_SELECT}"),
    Site(DECODE_FORWARD, _decode_targets, _read_decode, "input of vLLM SparseIndexerTopk.forward (decode)"),
    Site(DECODE_OP, _prefill_targets, _read_decode_op, f"input of vLLM {DECODE_OP} (decode)"),
)


__all__ = ["DECODE_FORWARD", "DECODE_OP", "DEEP_SELECT", "OP_NAME", "SITES"]
