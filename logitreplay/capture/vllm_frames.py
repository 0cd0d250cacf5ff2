"""What vLLM 0.33's calling frames say about an intercepted top-k call: the chunk's true layout, the
tensor-parallel row window, and the identity of the layer that called.

The op's arguments alone are not enough. vLLM 0.33 hands `top_k_per_row_prefill` *compressed* logits:
row i holds its own keys from column 0, `rowStarts` is zeros and `rowEnds = cu_seqlen_ke - cu_seqlen_ks`,
so the arguments show neither how many requests the rows belong to nor where each row's keys sit. The
`sparse_attn_indexer` function that calls the op has it all as locals (read, never written):

- `chunk` (`DeepseekV32IndexerPrefillChunkMetadata`): `token_start`, `token_end`, `num_reqs`,
  `max_seqlen_k`; `row_start`/`row_end`: the rows this call scores;
- `cu_seqlen_ks`: each row's key offset in the chunk's key buffer (with TP row sharding it is the local,
  narrowed slice, while `chunk.cu_seqlen_ks` stays full: the locals are the truth);
- `row_starts`: None for the compressed layout (CUDA), `cu_seqlen_ks` for the absolute one (XPU);
- `row_shard` (`PrefillRowShard` or None): with TP >= 2 and >= `indexer_tp_shard_min_rows` prefill rows,
  each rank scores only its window `[start, stop)` and the indices are all-gathered afterwards;
- `k_cache_prefix`: the `attn_metadata` key of the *key cache*, which in DeepSeek V4.1 may belong to
  another layer (non-owning index sources share the kv source's cache): not the layer's identity;
- `candidate_blocks`, `candidate_write`, `candidate_block_size`: V4.1 two-level selection. A consumer
  (`candidate_blocks` set, not the writer) has masked its logits to -inf outside the candidate blocks,
  in place, before the top-k.

The calling layer itself is the first frame further up whose `self` owns the op: a DeepSeek V3.2/V4/V4.1
attention layer (`self.indexer.indexer_op`; `_sparse_indexer_and_attn` or `forward`) or a V2-style
`Indexer` (`self.indexer_op`). Its `indexer.prefix` names the layer; `compress_ratio` and the attention's
`candidate_source_layer` come from the same objects. The frames are linked through torch's dispatcher
(`torch.ops.vllm.sparse_attn_indexer` calls back into Python on the same thread). Where no owner is
found (a compiled caller), the layer is named after its key cache and the case says so.

Every function here only reads Python objects and host ints: no device data, no sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch

from logitreplay.capture.frames import DEPTH, Layer, find_frame, host_int, host_str
from logitreplay.capture.hooks import layer_number


@dataclass
class Prefill:
    """One `sparse_attn_indexer` prefill chunk call, from its frame."""

    layer: Layer
    token_start: int  # the chunk's token range
    token_end: int
    row_start: int  # the rows this call scores (== the chunk's unless sharded)
    row_end: int
    num_reqs: int | None  # chunk.num_reqs: requests of the whole chunk
    max_seqlen_k: int | None
    layout: str  # "compressed": rows start at column 0; "absolute": at their key offset
    key_offsets: torch.Tensor | None  # cu_seqlen_ks (local): per-row key offset, on the device
    shard: dict[str, Any] | None  # {"start", "stop", "sizes"} when TP row sharding is active
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


def prefill_call(frame: FrameType | None) -> Prefill | None:
    """The facts of a `top_k_per_row_prefill` call made by vLLM's `sparse_attn_indexer` (None when the
    caller is something else: then only the op's arguments are known)."""
    f = find_frame(frame, local="k_cache_prefix")
    if f is None:
        return None
    local = f.f_locals
    chunk = local.get("chunk")
    token_start, token_end = host_int(getattr(chunk, "token_start", None)), host_int(getattr(chunk, "token_end", None))
    if token_start is None or token_end is None:
        return None
    row_start, row_end = host_int(local.get("row_start")), host_int(local.get("row_end"))
    shard = local.get("row_shard")
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
        shard=None if shard is None else {"start": host_int(getattr(shard, "start", None)),
                                          "stop": host_int(getattr(shard, "stop", None)),
                                          "sizes": [int(s) for s in getattr(shard, "sizes", [])]},
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
        facts = prefill_call(frame)
        if facts is None:
            return None
        return Selection("candidate_block_scores", facts.layer, facts.chunk_attrs(),
                         facts.num_reqs if facts.whole_chunk else None, facts.key_offsets,
                         {"candidate": {**facts.candidate,
                                        "block_size": host_int(frame.f_locals.get("block_size"))}})
    return None


__all__ = ["Prefill", "Selection", "calling_layer", "prefill_call", "selection_call"]
