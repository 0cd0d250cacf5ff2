"""What an intercepted vLLM top-k call is part of: the chunk and rows it scores, the requests, the
tensor-parallel split of the rows, and the layer that called.

The top-k's arguments alone are not enough: `top_k_per_row_prefill` and `deep_select_topk` get
*compressed* logits (row i holds its own keys from column 0, `rowEnds = cu_seqlen_ke - cu_seqlen_ks`), so
they show neither how many requests the rows belong to nor where each row's keys sit. Those facts are
taken from what is stable across releases, never from the locals of one release's function:

- the `sparse_attn_indexer` op's own arguments (its schema), found in the frame that runs it:
  `k_cache_prefix` (the `attn_metadata` key of the *key cache*, which in DeepSeek V4.1 may belong to
  another layer: not the layer's identity), `topk_indices_buffer`, and V4.1's `candidate_blocks`,
  `candidate_write`, `candidate_block_size` (a consumer has masked its logits to -inf outside its
  candidate blocks, in place, before the top-k);
- the rows: the top-k's output view is a slice of `topk_indices_buffer`, so its offset in the buffer is
  the position of its first row (host metadata of the views: no device data);
- the forward context's indexer metadata, `attn_metadata[k_cache_prefix].prefill`: the chunk holding
  that row (`token_start`, `token_end`, `num_reqs`, `max_seqlen_k`, `cu_seqlen_ks`: each row's key offset
  in the chunk's key buffer), and how TP ranks split the rows (`vllm_versions`: 0.33's contiguous
  windows from `row_shard_sizes`, 0.34's ShardQ rows from `shardq_gather_indices`, whose entries are the
  step positions of this rank's rows). A call may score part of a chunk (a rank's window, or a dense
  sub-window of a chunk planned for the fused kernel): its key offsets, requests and rows are its own.

The calling layer itself is the first frame further up whose `self` owns the op: a DeepSeek V3.2/V4/V4.1
attention layer (`self.indexer.indexer_op`) or a V2-style `Indexer` (`self.indexer_op`). Its
`indexer.prefix` names the layer; `compress_ratio` and the attention's `candidate_source_layer` come from
the same objects. The frames are linked through torch's dispatcher (`torch.ops.vllm.sparse_attn_indexer`
calls back into Python on the same thread). Where no owner is found (a compiled caller), the layer is
named after its key cache and the case says so.

DeepSeek V4.1's candidate paths (`selection_call`: `sparse_topk_remap` under `SparseMQAIndexer.forward`,
`select_candidate_blocks` under the indexer op's prefill loop) read their callers' locals, which vLLM 0.33
and 0.34 name alike (tests/test_capture_vllm_sparse_logits.py, tests/test_capture_vllm_real.py).

Every function here only reads Python objects, host ints and tensor metadata: no device data, no sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from logitreplay.capture.frames import DEPTH, Layer, find_frame, host_int, host_str
from logitreplay.capture.hooks import layer_number
from logitreplay.capture.vllm_versions import Release


@dataclass
class Prefill:
    """One prefill top-k call inside `sparse_attn_indexer`: its chunk, its rows, their TP split."""

    layer: Layer
    token_start: int  # the chunk's token range (positions in the prefill rows the chunks index)
    token_end: int
    row_start: int  # the rows this call scores (== the chunk's unless a window of it)
    row_end: int
    num_reqs: int | None  # chunk.num_reqs: requests of the whole chunk
    max_seqlen_k: int | None
    layout: str  # "compressed": rows start at column 0; "absolute": at their key offset
    key_offsets: torch.Tensor | None  # per-row key offset of this call's rows, on the device
    shard: dict[str, Any] | None  # the TP split of the step's prefill rows, when active
    positions: torch.Tensor | None = None  # ShardQ: the step position of each row, on the device
    candidate: dict[str, Any] = field(default_factory=dict)

    @property
    def whole_chunk(self) -> bool:
        return (self.row_start, self.row_end) == (self.token_start, self.token_end)

    def chunk_attrs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"token_start": self.token_start, "token_end": self.token_end,
                               "layout": self.layout}
        if self.max_seqlen_k is not None:
            out["max_seqlen_k"] = self.max_seqlen_k
        if not self.whole_chunk:
            out["row_start"], out["row_end"] = self.row_start, self.row_end
        return out


@dataclass
class IndexerOp:
    """The `sparse_attn_indexer` op call a top-k runs in: its schema arguments, and its frame."""

    frame: FrameType
    k_cache_prefix: str | None
    buffer: torch.Tensor | None  # topk_indices_buffer
    candidate_blocks: Any
    candidate_write: bool
    candidate_block_size: int | None


def indexer_op(frame: FrameType | None) -> IndexerOp | None:
    """The nearest frame running the indexer op (its arguments `k_cache_prefix` and `topk_indices_buffer`)."""
    f = find_frame(frame, local="topk_indices_buffer")
    if f is None or "k_cache_prefix" not in f.f_locals:
        return None
    local = f.f_locals
    buffer = local.get("topk_indices_buffer")
    return IndexerOp(f, _layer_name(local.get("k_cache_prefix")),
                     buffer if isinstance(buffer, torch.Tensor) else None, local.get("candidate_blocks"),
                     bool(local.get("candidate_write", False)), host_int(local.get("candidate_block_size")))


def _layer_name(value: Any) -> str | None:
    """`k_cache_prefix` as a string: 0.34 passes it encoded through the op and resolves it on entry."""
    if value is None or isinstance(value, str):
        return value
    try:
        from vllm.utils.torch_utils import _resolve_layer_name

        return str(_resolve_layer_name(value))
    except Exception:
        return str(value)


def buffer_row(buffer: torch.Tensor, view: torch.Tensor) -> int | None:
    """The row of `buffer` where `view` (a slice of its rows) starts; None when it is not one."""
    if view.dim() != 2 or buffer.dim() != 2 or view.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr():
        return None
    offset = view.storage_offset() - buffer.storage_offset()
    if offset < 0 or buffer.stride(0) <= 0:
        return None
    row, column = divmod(int(offset), int(buffer.stride(0)))
    return row if column == 0 and row < buffer.shape[0] else None


def indexer_metadata(k_cache_prefix: str | None) -> Any:
    """The forward context's indexer metadata of the key cache `k_cache_prefix` (None outside a step)."""
    try:
        from vllm.forward_context import get_forward_context

        attn_metadata = get_forward_context().attn_metadata
    except Exception:
        return None
    return attn_metadata.get(k_cache_prefix) if isinstance(attn_metadata, dict) else None


def prefill_call(frame: FrameType | None, out: torch.Tensor, rows: int, starts: torch.Tensor | None,
                 release: Release | None, tp_rank: int) -> Prefill | None:
    """The facts of a prefill top-k call writing its indices to `out` (`rows` rows; `starts`: the row
    starts it was given, None for DeepSelect's compressed rows). None when it is not inside
    `sparse_attn_indexer`'s prefill, or its rows are in no chunk of the step's metadata."""
    op = indexer_op(frame)
    if op is None or op.buffer is None:
        return None
    first = buffer_row(op.buffer, out)
    metadata = indexer_metadata(op.k_cache_prefix)
    prefill = getattr(metadata, "prefill", None)
    if first is None or prefill is None:
        return None
    chunk = next((c for c in getattr(prefill, "chunks", None) or []
                  if host_int(getattr(c, "token_start", None)) is not None
                  and c.token_start <= first < c.token_end), None)
    if chunk is None or first + rows > chunk.token_end:
        return None
    lo = first - chunk.token_start
    ks = getattr(chunk, "cu_seqlen_ks", None)
    ks = ks[lo:lo + rows] if isinstance(ks, torch.Tensor) and ks.shape[0] >= lo + rows else None
    absolute = (starts is not None and ks is not None and starts.numel() > 0
                and starts.untyped_storage().data_ptr() == ks.untyped_storage().data_ptr())
    layer = calling_layer(op.frame.f_back, op.k_cache_prefix)
    candidate: dict[str, Any] = {}
    if op.candidate_blocks is not None:
        candidate = {"masked": not op.candidate_write, "writes_candidates": op.candidate_write,
                     "block_size": op.candidate_block_size,
                     "source_layer": layer.index if op.candidate_write else layer.candidate_source_layer}
    shard, positions = _tp_rows(prefill, metadata, release, tp_rank, first, rows, op.candidate_blocks is not None)
    return Prefill(layer, int(chunk.token_start), int(chunk.token_end), first, first + rows,
                   host_int(getattr(chunk, "num_reqs", None)), host_int(getattr(chunk, "max_seqlen_k", None)),
                   "absolute" if absolute else "compressed", ks, shard, positions, candidate)


def _tp_rows(prefill: Any, metadata: Any, release: Release | None, tp_rank: int, first: int, rows: int,
             candidates: bool) -> tuple[dict[str, Any] | None, torch.Tensor | None]:
    """How the step's prefill rows are split across TP ranks, from the prefill metadata (V4.1 candidate
    rows are never split)."""
    if release is None or candidates:
        return None, None
    if release.tp_rows == "shardq":
        indices = getattr(prefill, "shardq_gather_indices", None)
        if not isinstance(indices, torch.Tensor):
            return None, None
        return {"scheme": "shardq", "rows": int(indices.shape[0])}, indices[first:first + rows]
    sizes = getattr(prefill, "row_shard_sizes", None)
    if not sizes:
        return None, None
    decode_tokens = host_int(getattr(metadata, "num_decode_tokens", None)) or 0
    start = decode_tokens + sum(sizes[:tp_rank])
    return {"scheme": "row_shard", "start": start, "stop": start + int(sizes[tp_rank]),
            "sizes": [int(n) for n in sizes]}, None


def calling_layer(frame: FrameType | None, k_cache_prefix: str | None, op: Any = None) -> Layer:
    """The layer whose indexer made this call: the first `self` above `frame` that owns an indexer op
    (`op`, when known, must be that indexer's `indexer_op`)."""
    for _ in range(DEPTH):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        indexer: Any = getattr(owner, "indexer", None)
        attention: Any
        if getattr(indexer, "indexer_op", None) is not None:  # an attention layer
            attention = owner
        elif getattr(owner, "indexer_op", None) is not None and hasattr(owner, "prefix"):
            attention, indexer = None, owner  # an Indexer module called directly
        else:
            frame = frame.f_back
            continue
        if op is not None and indexer.indexer_op is not op:
            frame = frame.f_back
            continue
        name = str(getattr(indexer, "prefix", "") or getattr(attention, "prefix", "unknown"))
        index = layer_number(name)
        if index is None:
            index = host_int(getattr(attention, "layer_id", None))
        ratio = host_int(getattr(indexer, "compress_ratio", None))
        source = host_int(getattr(attention, "candidate_source_layer", None))
        return Layer(name, -1 if index is None else index, "indexer module",
                     ratio if ratio is not None else host_int(getattr(indexer.indexer_op, "compress_ratio", None)),
                     k_cache_prefix, source if source is not None and source >= 0 else None)
    name = k_cache_prefix or "unknown"
    index = layer_number(name)
    return Layer(name, -1 if index is None else index, "k_cache_prefix", None, k_cache_prefix)


def chunk_locals(frame: FrameType | None) -> Prefill | None:
    """The facts of a V4.1 candidate-block selection inside vLLM 0.33's `sparse_attn_indexer`, from the
    locals of its prefill loop (`chunk`, `row_start`, `row_end`, `cu_seqlen_ks`, `row_starts`)."""
    f = find_frame(frame, local="k_cache_prefix")
    if f is None:
        return None
    local = f.f_locals
    chunk = local.get("chunk")
    token_start, token_end = host_int(getattr(chunk, "token_start", None)), host_int(getattr(chunk, "token_end", None))
    if token_start is None or token_end is None:
        return None
    row_start, row_end = host_int(local.get("row_start")), host_int(local.get("row_end"))
    ks = local.get("cu_seqlen_ks")
    candidates = local.get("candidate_blocks")
    candidate: dict[str, Any] = {}
    layer = calling_layer(f.f_back, host_str(local.get("k_cache_prefix")))
    if candidates is not None:
        writes = bool(local.get("candidate_write", False))
        candidate = {"masked": not writes, "writes_candidates": writes,
                     "block_size": host_int(local.get("candidate_block_size")),
                     "source_layer": layer.candidate_source_layer if not writes else layer.index}
    return Prefill(
        layer=layer,
        token_start=token_start, token_end=token_end,
        row_start=token_start if row_start is None else row_start,
        row_end=token_end if row_end is None else row_end,
        num_reqs=host_int(getattr(chunk, "num_reqs", None)),
        max_seqlen_k=host_int(getattr(chunk, "max_seqlen_k", None)),
        layout="compressed" if local.get("row_starts") is None else "absolute",
        key_offsets=ks if isinstance(ks, torch.Tensor) else None,
        shard=None,
        candidate=candidate,
    )


@dataclass
class Selection:
    """A DeepSelect call (`deep_select_topk`) of DeepSeek V4.1's two-level selection, from its frames."""

    kind: str  # "sparse_mqa_logits" (bf16, candidate tokens only) or "candidate_block_scores"
    layer: Layer
    chunk: dict[str, Any]
    num_reqs: int | None
    key_offsets: torch.Tensor | None
    details: dict[str, Any]


def selection_call(frame: FrameType | None) -> Selection | None:
    """The facts of a prefill `deep_select_topk` call (None for any other caller, decode included).

    - From `sparse_topk_remap` under `sparse_mqa_logits_prefill_chunk` (`SparseMQAIndexer.forward`, with
      `attention_config.indexer_sparse_logits`): bf16 logits of the candidate tokens only, column
      `j * sparse_block_kv + o` scoring sparse block `sparse_indices[row, j]`; the valid columns are
      the prefix `[0, end)`.
    - From `select_candidate_blocks` under `sparse_attn_indexer`'s prefill loop (the candidate source
      layer): per-block maxima of its logits, from which it publishes its candidate blocks.
    """
    if frame is None:
        return None
    name = frame.f_code.co_name
    if name == "sparse_topk_remap":
        if find_frame(frame, function="sparse_mqa_logits_prefill_chunk", depth=4) is None:
            return None  # paged decode rows
        f = find_frame(frame, local="chunk")
        if f is None or f.f_locals.get("self") is None:
            return None
        op, chunk = f.f_locals["self"], f.f_locals["chunk"]
        prefix = host_str(getattr(getattr(op, "k_cache", None), "prefix", None))
        layer = calling_layer(f.f_back, prefix, op)
        local = frame.f_locals
        ks = local.get("row_ks")
        block = host_int(getattr(op, "candidate_block_size", None))
        return Selection(
            "sparse_mqa_logits", layer,
            {"token_start": host_int(getattr(chunk, "token_start", None)),
             "token_end": host_int(getattr(chunk, "token_end", None)), "layout": "sparse_candidates",
             "max_seqlen_k": host_int(getattr(chunk, "max_seqlen_k", None))},
            host_int(getattr(chunk, "num_reqs", None)), ks if isinstance(ks, torch.Tensor) else None,
            {"sparse_block_kv": host_int(local.get("sparse_block_kv")),
             "candidate": {"masked": True, "scored": "candidate blocks only", "block_size": block,
                           "source_layer": layer.candidate_source_layer}})
    if name == "select_candidate_blocks":
        f = find_frame(frame, local="k_cache_prefix")
        if f is None or frame.f_locals.get("out") is not f.f_locals.get("chunk_candidates"):
            return None  # decode rows: their `out` is `decode_candidates`
        facts = chunk_locals(frame)
        if facts is None:
            return None
        return Selection("candidate_block_scores", facts.layer, facts.chunk_attrs(),
                         facts.num_reqs if facts.whole_chunk else None, facts.key_offsets,
                         {"candidate": {**facts.candidate,
                                        "block_size": host_int(frame.f_locals.get("block_size"))}})
    return None


__all__ = ["IndexerOp", "Prefill", "Selection", "buffer_row", "calling_layer", "chunk_locals", "indexer_metadata",
           "indexer_op", "prefill_call", "selection_call"]
