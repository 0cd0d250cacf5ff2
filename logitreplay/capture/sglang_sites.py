"""The SGLang call site the capture plugin intercepts, and how one call is read (the release's facts:
`sglang_versions`).

SGLang's DSA indexer (`sglang/srt/layers/attention/dsa/dsa_indexer.py`, class `Indexer`; DeepSeek V3.2 and
GLM-5) selects with `metadata.topk_transform(logits, self.index_topk, ...)`, where `metadata` is the
`DSAIndexerMetadata` its attention backend built for the forward (`dsa_indexer_metadata.py`):

- `_get_topk_paged` (decode, target verify, draft extend v2): `topk_transform(logits, index_topk)` over
  (batch * next_n, max_seq_len) fp32 logits read from the paged index-K cache; row r's keys are columns
  [0, seqlens_expanded[r]) and the rest of the row is left as the logits kernel left it (not cleaned);
- `_get_topk_ragged` (extend): `topk_transform(logits, index_topk, ks=ks)` over (rows, keys of the whole
  batch) logits, row r's window [ks[r], ks[r] + seqlens_expanded[r]) at its request's offset in the
  batch's flattened keys; when the logits exceed the memory budget the rows go in chunks
  `[start, end)`, each `topk_transform(logits_chunk, index_topk, ks=ks[start:end], cu_seqlens_q=...,
  ke_offset=lengths_chunk, batch_idx_list=..., topk_indices_offset_override=...)`.

`topk_transform` hands the logits to `DSATopKBackend.topk_transform` (`dsa_topk_backend.py`), whose result
is not top-k indices: fused (`SGLANG_DSA_FUSE_TOPK`, the default), the selected positions come out mapped
through the request's page table (PAGED: `topk_transform_paged_v2` over `real_page_table` for decode-shaped
calls, else sgl_kernel's `fast_topk_transform_fused` over `page_table_1`) or shifted by a per-row offset
(RAGGED: `topk_transform_ragged_v2` or `fast_topk_transform_ragged_fused`); unfused (`topk_func`) they are
row-local. `resolve` repeats that dispatch from host facts (shapes, switches) to name the call that ran,
and the case keeps the tables it read (`extras`, staged with the logits: SGLang rewrites them in place
from step to step). On the writer thread `finish` records them (`attrs["transform"]`, exact runs) and
maps the production output back to row-local indices, the archive's reference semantics.

Everything on the model's thread reads host facts and enqueues device copies only: no sync.
"""

from __future__ import annotations

import functools
import importlib
import math
import sys
import weakref
from dataclasses import dataclass
from types import FrameType
from typing import Any

import numpy as np
import torch

from logitreplay.capture.frames import Layer
from logitreplay.capture.sglang_versions import Release
from logitreplay.capture.sites import Call, Site
from logitreplay.capture.writer import Finish, runs

_PAGED_PATHS = {"DECODE": "decode", "TARGET_VERIFY": "target_verify", "DRAFT_EXTEND_V2": "draft_extend"}
K_ONLY = ("no logits: when no sequence is longer than index_topk every key is selected, and SGLang's K-only "
          "path runs the top-k on dummy zeros")
_UNFUSED = {"sgl-kernel": "sgl_kernel.fast_topk_v2", "torch": "torch.topk", "flashinfer": "flashinfer.top_k"}
_DEPTH = 64  # from the indexer's frame up to the causal LM's forward


@dataclass(frozen=True)
class Transform:
    """The call SGLang's dispatch made and what its output means: `paged` (a KV slot through `page_table`,
    `page_size` tokens a page, row r reading table row `table_rows[r]`), `ragged` (position + `offsets[r]`),
    `local` (row-local indices), or `unknown` (a path this plugin does not map: no reference is kept)."""

    call: str
    output: str
    page_size: int = 1
    extras: dict[str, torch.Tensor] | None = None


def site(release: Release) -> Site:
    """The release's top-k entry, `DSAIndexerMetadata.topk_transform`, as a site: its calls read with the
    release's facts and counted by path (`paths`)."""
    return Site(release.transform, functools.partial(targets, release), functools.partial(read, release),
                f"input of SGLang {release.metadata_class}.{release.transform}",
                paths=functools.partial(paths, release))


def targets(release: Release) -> list[Any]:
    return [getattr(importlib.import_module(release.metadata_module), release.metadata_class)]


def paths(release: Release, frame: FrameType | None) -> tuple[str, str | None]:
    """The path of a call, from its caller: `decode`, `target_verify`, `draft_extend` (the indexer's paged
    top-k, by forward mode), `extend` (ragged), or one that holds nothing to capture, and why."""
    caller = frame.f_code.co_name if frame is not None else None
    if caller == release.paged_caller:
        mode = getattr(getattr(frame.f_locals.get("forward_batch"), "forward_mode", None), "name", None)  # type: ignore[union-attr]
        return _PAGED_PATHS.get(mode or "", "decode"), None
    if caller == release.ragged_caller:
        return "extend", None
    if caller == release.k_only_caller:
        return "k_only", K_ONLY
    return "other", f"called by {caller or 'an unknown caller'}, not by the indexer's top-k paths"


def read(release: Release, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
         frame: FrameType | None) -> Call | None:
    """`DSAIndexerMetadata.topk_transform(self, logits, topk, ks=None, cu_seqlens_q=None, ke_offset=None,
    batch_idx_list=None, topk_indices_offset_override=None)` called by `Indexer._get_topk_paged` or
    `_get_topk_ragged` (`paths` counts every other caller as not capturable)."""
    paged_caller, ragged_caller = release.paged_caller, release.ragged_caller
    if frame is None or frame.f_code.co_name not in (paged_caller, ragged_caller) or not args:
        return None
    metadata, given = args[0], dict(zip(release.params, args[1:], strict=False))
    given.update(kwargs)
    logits, top_k = given["logits"], int(given["topk"])
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not isinstance(result, torch.Tensor):
        return None
    ks, ke_offset = given.get("ks"), given.get("ke_offset")
    am = metadata.attn_metadata
    lengths = ke_offset if ke_offset is not None else metadata.get_seqlens_expanded()
    rows = int(logits.shape[0])
    starts = torch.zeros_like(lengths) if ks is None else ks
    ends = starts + lengths
    local = frame.f_locals
    indexer, batch = local.get("self"), local.get("forward_batch")
    transform = resolve(release, metadata, logits, top_k, given)
    backend = getattr(metadata.topk_backend, "value", str(metadata.topk_backend))
    layer = calling_layer(frame, indexer)
    mode = getattr(getattr(batch, "forward_mode", None), "name", None)
    attrs: dict[str, Any] = {
        **layer.attrs(), "logits_kind": "paged_mqa_logits" if frame.f_code.co_name == paged_caller else "mqa_logits",
        "topk_backend": backend, "topk_transform": transform.call,
        "sglang": {"caller": f"Indexer.{frame.f_code.co_name}", "forward_mode": mode,
                   "method": getattr(metadata.topk_transform_method, "name", None),
                   "force_unfused_topk": bool(getattr(metadata, "force_unfused_topk", False)),
                   "page_size": int(am.page_size), "output": transform.output},
        "reference_source": f"indices written by SGLang {transform.call}, mapped back to row-local indices"}
    finish = _finish(transform, top_k)
    if frame.f_code.co_name == paged_caller:
        next_n, batch_size = _int(local.get("next_n")), _int(local.get("B"))
        if mode in ("DECODE", "TARGET_VERIFY") and next_n and batch_size and batch_size * next_n == rows:
            attrs.update(kind="decode", chunk={}, decode={
                "next_n": next_n, "per_row": next_n > 1, "max_model_len": int(logits.shape[1]),
                "max_seq_len": _int(local.get("max_seq_len")), "backend": backend, "speculative": next_n > 1})
        else:
            attrs["chunk"] = {"layout": "paged"}
        return Call(logits, starts, ends, result, top_k, int(logits.stride(0)), layer, batch_size, None, attrs,
                    extras=transform.extras, finish=finish)
    total = _int(local.get("q_offset")) or rows
    chunk_start, chunk_end = _int(local.get("start")), _int(local.get("end"))  # a chunked call's rows
    start, end = (chunk_start, chunk_end) if chunk_start is not None and chunk_end is not None else (0, rows)
    attrs["chunk"] = {"layout": "absolute", "forward_rows": total, "max_seqlen_k": _int(local.get("max_seq_len"))}
    return Call(logits, starts, ends, result, top_k, int(logits.stride(0)), layer,
                _requests_in(getattr(batch, "extend_seq_lens_cpu", None), start, end, total),
                ks if ks is not None and ks.shape[0] == rows else None, attrs,
                row_window=None if (start, end) == (0, total) else (start, end),
                extras=transform.extras, finish=finish)


def resolve(release: Release, metadata: Any, logits: torch.Tensor, top_k: int, given: dict[str, Any]) -> Transform:
    """The kernel `DSATopKBackend.topk_transform` calls for these arguments (its dispatch, from shapes and
    switches only) and the tables its output refers to."""
    module = sys.modules[release.backend_module]
    backend, am = metadata.topk_backend, metadata.attn_metadata
    ks, batch_idx = given.get("ks"), given.get("batch_idx_list")
    lengths = given.get("ke_offset")
    lengths = lengths if lengths is not None else metadata.get_seqlens_expanded()
    if not module.envs.SGLANG_DSA_FUSE_TOPK.get() or getattr(metadata, "force_unfused_topk", False):
        return Transform(_UNFUSED.get(backend.value, f"{backend.value} topk_func"), "local")
    if given.get("topk_indices_offset_override") is not None:
        offsets, cu_q = given["topk_indices_offset_override"], None
    elif given.get("cu_seqlens_q") is not None:
        offsets = cu_q = None  # built from a per-call cu_seqlens_q: only the chunked PAGED path passes one
    else:
        offsets, cu_q = am.topk_indices_offset, am.cu_seqlens_q
    paged = metadata.topk_transform_method == module.TopkTransformMethod.PAGED
    rows = int(logits.shape[0])
    v2 = backend.should_use_topk_v2() and 0 < top_k <= release.v2_max_topk and batch_idx is None
    if v2 and paged and ks is None and lengths.shape[0] == rows == am.real_page_table.shape[0]:
        return Transform("topk_transform_paged_v2", "paged", int(am.page_size), {"page_table": am.real_page_table})
    if v2 and not paged and offsets is not None and lengths.shape[0] == rows == offsets.shape[0]:
        return Transform("topk_transform_ragged_v2", "ragged", 1, {"offsets": offsets})
    if module._is_hip and paged and backend.should_use_topk_v2():
        return Transform("topk_transform_packed_v2 (ROCm)", "unknown")
    legacy = {"sgl-kernel": ("fast_topk_transform_fused", "fast_topk_transform_ragged_fused"),
              "flashinfer": ("flashinfer.top_k_page_table_transform", "flashinfer.top_k_ragged_transform")}
    if backend.value not in legacy:
        return Transform(f"{backend.value} (no fused transform)", "unknown")
    paged_call, ragged_call = legacy[backend.value]
    if not paged:
        return (Transform(ragged_call, "ragged", 1, {"offsets": offsets}) if offsets is not None
                else Transform(ragged_call, "unknown"))
    table = am.page_table_1
    if isinstance(batch_idx, torch.Tensor) and batch_idx.shape[0] == rows:
        return Transform(paged_call, "paged", 1, {"page_table": table, "table_rows": batch_idx})
    if batch_idx is None and cu_q is not None and (ks is None or backend.value == "sgl-kernel"):
        return Transform(paged_call, "paged", 1, {"page_table": table, "cu_seqlens_q": cu_q})
    return Transform(paged_call, "unknown")


def _finish(transform: Transform, top_k: int) -> Finish:
    """The writer thread's step: the tables as exact runs in `attrs["transform"]`, the production output
    mapped back to row-local indices (None, and the reason recorded, where it does not map)."""

    def finish(reference: np.ndarray | None, extras: dict[str, np.ndarray], starts: np.ndarray,
               ends: np.ndarray) -> tuple[np.ndarray | None, dict[str, Any]]:
        lengths = ends.astype(np.int64) - starts.astype(np.int64)
        facts: dict[str, Any] = {"call": transform.call, "output": transform.output, "top_k": top_k}
        table_rows = _table_rows(extras, lengths.shape[0])
        if "offsets" in extras:
            facts["row_offsets"] = runs(extras["offsets"].astype(np.int64))
        if "page_table" in extras:
            facts.update(page_size=transform.page_size, table_rows=runs(table_rows),
                         page_table=_tables(extras["page_table"], table_rows, lengths, transform.page_size))
        local = None
        if reference is not None:
            try:
                local = _to_local(transform, reference, extras, table_rows, lengths)
            except ValueError as e:
                facts["reference"] = f"not kept: {e}"
        return local, {"transform": facts}

    return finish


def _to_local(transform: Transform, out: np.ndarray, extras: dict[str, np.ndarray], table_rows: np.ndarray,
              lengths: np.ndarray) -> np.ndarray:
    """Row-local indices from what the production call wrote (-1 stays -1)."""
    out = out.astype(np.int64)
    chosen = out >= 0
    if transform.output == "local":
        local = out
    elif transform.output == "ragged":
        local = out - extras["offsets"].astype(np.int64)[:, None]
    elif transform.output == "paged":
        local = np.full_like(out, -1)
        table, size = extras["page_table"].astype(np.int64), transform.page_size
        for r in range(out.shape[0]):
            pages = table[table_rows[r], : math.ceil(int(lengths[r]) / size)]
            order = np.argsort(pages, kind="stable")
            slots = out[r, chosen[r]]
            at = np.searchsorted(pages[order], slots // size).clip(max=max(pages.size - 1, 0))
            if pages.size == 0 or not np.array_equal(pages[order][at], slots // size):
                raise ValueError(f"row {r} selected a slot outside its pages")
            local[r, chosen[r]] = order[at] * size + slots % size
    else:
        raise ValueError(f"{transform.call}'s output is not mapped by this plugin")
    local = np.where(chosen, local, -1)
    if ((local >= lengths[:, None]) | (local < -1)).any():
        raise ValueError("an index outside its row")
    return local.astype(np.int32)


def _table_rows(extras: dict[str, np.ndarray], rows: int) -> np.ndarray:
    """The page-table row each logits row reads: given per row, from the per-request row prefix sums, or
    the row itself."""
    if "table_rows" in extras:
        return extras["table_rows"].astype(np.int64)
    if "cu_seqlens_q" in extras:
        return np.searchsorted(extras["cu_seqlens_q"][1:].astype(np.int64), np.arange(rows), side="right")
    return np.arange(rows)


def _tables(table: np.ndarray, table_rows: np.ndarray, lengths: np.ndarray, page_size: int) -> list[Any]:
    """Each table row's pages that its rows read (up to the longest row's), as runs of consecutive pages
    [first column, end column, first page]; table rows no row reads are empty."""
    used = np.zeros(table.shape[0], dtype=np.int64)
    np.maximum.at(used, table_rows, -(-lengths // page_size))
    return [runs(table[t, : int(n)].astype(np.int64), 1) for t, n in enumerate(used.tolist())]


def calling_layer(frame: FrameType, indexer: Any) -> Layer:
    """The indexer's own name in the model (SGLang's `Indexer` keeps only its `layer_id`): its path among
    the modules of the outermost module found up the stack, the causal LM."""
    index = _int(getattr(indexer, "layer_id", None))
    root, f = None, frame.f_back
    for _ in range(_DEPTH):
        if f is None:
            break
        owner = f.f_locals.get("self")
        if isinstance(owner, torch.nn.Module):
            root = owner
        f = f.f_back
    name = _names(root).get(id(indexer)) if root is not None else None
    if name is None:
        return Layer(f"layer {index} indexer", -1 if index is None else index, "layer_id")
    return Layer(name, -1 if index is None else index, "indexer module")


_NAMES: weakref.WeakKeyDictionary[torch.nn.Module, dict[int, str]] = weakref.WeakKeyDictionary()


def _names(root: torch.nn.Module) -> dict[int, str]:
    """Module paths by module id, once per model (a walk over its modules on its first captured call)."""
    names = _NAMES.get(root)
    if names is None:
        names = _NAMES[root] = {id(m): n for n, m in root.named_modules()}
    return names


def _requests_in(extend_lens: Any, start: int, end: int, total: int) -> int | None:
    """Requests with query rows in [start, end) of the forward's rows, from the host's extend lengths."""
    if not isinstance(extend_lens, list | tuple) or sum(int(n) for n in extend_lens) != total:
        return None
    bounds = np.concatenate(([0], np.cumsum(np.asarray(extend_lens, dtype=np.int64))))
    return int(((bounds[:-1] < end) & (bounds[1:] > start) & (bounds[1:] > bounds[:-1])).sum())


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


__all__ = ["K_ONLY", "Transform", "calling_layer", "paths", "read", "resolve", "site", "targets"]
