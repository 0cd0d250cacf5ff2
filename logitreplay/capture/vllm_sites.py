"""The vLLM call sites (0.33, 0.34) the capture plugin intercepts (`SITES`), and how each call is read.

A `Site` names the attribute to wrap and where to find it; its `read` turns one production call's
arguments (positional exactly as vLLM passes them), its result and the calling frames (`vllm_frames`)
into a `Call`: the tensors as the kernel saw them, still on the device, and the facts a case records.
Reading never syncs with the device. `vllm_plugin` wraps the sites and stages the calls.
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from logitreplay.capture import serving, vllm_frames
from logitreplay.capture.frames import find_frame
from logitreplay.capture.sites import Call, Site
from logitreplay.capture.vllm_versions import FUSED_OFF, Release
from logitreplay.capture.writer import runs

log = logging.getLogger("logitreplay.capture")

OP_NAME = "top_k_per_row_prefill"
DECODE_OP = "top_k_per_row_decode"
DECODE_FORWARD = "forward"  # of SparseIndexerTopk
DEEP_SELECT = "deep_select_topk"
FUSED_TOPK = "fused_mqa_topk_prefill"
FUSED_MODULE = "vllm.model_executor.kernels.attention.dsa.fused_mqa_topk"
SPARSE_REMAP = "sparse_topk_remap"  # DeepSeek V4.1's top-k over sparse logits, DeepSelect's caller
SPARSE_DECODE = "sparse_mqa_logits_paged_decode"
INDEXER_MODULE = "vllm.model_executor.layers.sparse_attn_indexer"


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
    release, tp_rank = _context()
    facts = vllm_frames.prefill_call(frame, indices, rows, row_starts, release, tp_rank)
    if facts is None:  # not called by sparse_attn_indexer: only the arguments are known
        return Call(logits[:rows], row_starts[:rows], row_ends[:rows], indices[:rows, :top_k], top_k,
                    int(stride0), vllm_frames.calling_layer(frame, None), None, None, {"chunk": {}})
    return _prefill_case(facts, logits[:rows], row_starts[:rows], row_ends[:rows], indices[:rows, :top_k], top_k,
                         f"indices written by vLLM {OP_NAME}")


def _prefill_case(facts: vllm_frames.Prefill, logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                  reference: torch.Tensor, top_k: int, source: str) -> Call:
    """A prefill top-k inside `sparse_attn_indexer` as a `Call`: its rows' chunk, key offsets, TP split."""
    attrs: dict[str, Any] = {**facts.layer.attrs(), "logits_kind": "mqa_logits", "chunk": facts.chunk_attrs(),
                             "reference_source": source}
    if facts.candidate:
        attrs["candidate"] = facts.candidate
    extras, finish = None, None
    if facts.positions is not None:  # ShardQ: rows are this rank's, gathered; record where each sits
        extras, finish = {"row_positions": facts.positions}, _row_positions
    # 0.33's windows are rows of the step; ShardQ rows are gathered, their step positions are row_positions
    window = (facts.row_start, facts.row_end) if facts.shard is not None and "sizes" in facts.shard else None
    return Call(logits, starts, ends, reference, top_k, int(logits.stride(0)), facts.layer,
                facts.num_reqs if facts.whole_chunk and facts.shard is None else None, facts.key_offsets, attrs,
                facts.shard, window, extras, finish)


def _row_positions(reference: Any, extras: dict[str, Any], starts: Any, ends: Any) -> tuple[Any, dict[str, Any]]:
    """On the writer thread: the step position of each ShardQ row, as runs of consecutive positions."""
    return reference, {"row_positions": runs(extras["row_positions"], step=1)}


def _read_deep_select(args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
                      frame: FrameType | None) -> Call | None:
    """`deep_select_topk(input, topk, end=None, output_idx=None, indices_dtype=int32) -> indices`: in
    `sparse_attn_indexer`'s prefill loop (0.34: bf16 logits, `end=row_ends`, `output_idx` a slice of the
    top-k buffer) or in DeepSeek V4.1's candidate paths."""
    if not args or not isinstance(result, torch.Tensor):
        return None
    logits = args[0]
    top_k = int(args[1] if len(args) > 1 else kwargs["topk"])
    end = args[2] if len(args) > 2 else kwargs.get("end")
    rows, cols = (int(n) for n in logits.shape)
    ends = end if end is not None else torch.full((rows,), cols, dtype=torch.int32, device=logits.device)
    source = f"indices written by vLLM {DEEP_SELECT} (DeepSelect)"
    op = vllm_frames.indexer_op(frame)
    if op is not None and op.frame is frame:  # called by the indexer op itself: its prefill loop
        release, tp_rank = _context()
        facts = vllm_frames.prefill_call(frame, result, rows, None, release, tp_rank)
        if facts is None:
            return None
        return _prefill_case(facts, logits, torch.zeros_like(ends), ends, result[:rows, :top_k], top_k, source)
    selection = vllm_frames.selection_call(frame)
    if selection is None:
        return None
    ks = selection.key_offsets
    attrs = {**selection.layer.attrs(), "logits_kind": selection.kind, "chunk": selection.chunk,
             **selection.details, "reference_source": source}
    if selection.kind == "sparse_mqa_logits":
        attrs["sparse_logits"] = {"dtype": "bfloat16", "columns": "candidate tokens only: column j * "
                                  "sparse_block_kv + o scores sparse block sparse_indices[row, j]"}
    return Call(logits, torch.zeros_like(ends), ends, result[:rows, :top_k], top_k, int(logits.stride(0)),
                selection.layer, selection.num_reqs, ks if ks is not None and ks.shape[0] == rows else None, attrs)


def _deep_select_path(frame: FrameType | None) -> tuple[str, str | None]:
    """DeepSeek V4.1's top-k over sparse logits (`sparse_topk_remap`) is counted as its own path,
    `sparse_logits`; its decode rows are not captured. Every other DeepSelect call is `deepselect`."""
    if frame is None or frame.f_code.co_name != SPARSE_REMAP:
        return "deepselect", None
    if find_frame(frame, function=SPARSE_DECODE, depth=4) is not None:
        return "sparse_logits", (f"the sparse-logits decode rows ({SPARSE_DECODE}) are not captured: only "
                                 "prefill chunks' sparse logits are")
    return "sparse_logits", None


def _context() -> tuple[Release | None, int]:
    """The vLLM release and this process's TP rank, as the installed capture knows them."""
    capture = serving._active
    release = getattr(capture, "release", None)
    return (release if isinstance(release, Release) else None,
            capture._ranks()[0] if capture is not None else 0)


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
    return defining + _binders(lambda r: r.deep_select_binders)


def _fused_targets() -> list[Any]:
    """`fused_mqa_topk_prefill` where it is defined and in `sparse_attn_indexer`, which binds it by name."""
    release, _ = _context()
    if release is None or release.fused_topk is None:
        return []
    try:
        defining = [importlib.import_module(FUSED_MODULE)]
    except Exception as e:
        log.debug("logitreplay capture: no %s: %s", FUSED_TOPK, e)
        defining = []
    return defining + [sys.modules[m] for m in (INDEXER_MODULE,) if m in sys.modules]


def _binders(names: Callable[[Release], tuple[str, ...]]) -> list[Any]:
    release, _ = _context()
    return [] if release is None else [sys.modules[m] for m in names(release) if m in sys.modules]


SITES: tuple[Site, ...] = (
    Site(OP_NAME, _prefill_targets, _read_prefill, f"input of vLLM {OP_NAME}"),
    Site(DEEP_SELECT, _deep_select_targets, _read_deep_select, f"input of vLLM {DEEP_SELECT}", "deepselect",
         paths=_deep_select_path),
    Site(DECODE_FORWARD, _decode_targets, _read_decode, "input of vLLM SparseIndexerTopk.forward (decode)",
         "decode"),
    Site(DECODE_OP, _prefill_targets, _read_decode_op, f"input of vLLM {DECODE_OP} (decode)", "decode"),
    Site(FUSED_TOPK, _fused_targets, lambda *_: None, f"vLLM {FUSED_TOPK}", "fused",
         uncapturable=f"{FUSED_TOPK} scores and selects in one kernel and builds no logits; set {FUSED_OFF} "
                      "in the server's environment for a capture run (prefill then takes the logits path)"),
)


__all__ = ["DECODE_FORWARD", "DECODE_OP", "DEEP_SELECT", "FUSED_TOPK", "OP_NAME", "SITES"]
