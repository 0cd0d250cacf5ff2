"""Builds prefill steps the way vLLM 0.33's indexer metadata builder does, and runs them through the stand-in
tree's real call path (attention layer -> indexer op -> torch.ops.vllm.sparse_attn_indexer -> top-k).

Chunk bounds follow `BuildPrefillChunkMetadataKernel` (mla/indexer.py l.497-570): for every query token of
request b, `ks = cu_seq_lens[b]` (the request's offset in the chunk's gathered key buffer) and
`ke = ks + (start_pos + 1 + offset) // compress_ratio` with `start_pos = seq_len - query_len`;
`max_seqlen_k` is the largest compressed sequence length of the chunk's requests.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

ROOT = Path(__file__).parent
HEADS, DIM = 4, 16


@contextmanager
def vllm_on_path() -> Iterator[Any]:
    """The stand-in `vllm` importable for the block; dropped from sys.modules afterwards, so that code
    elsewhere that probes for vLLM does not find it."""
    sys.path.insert(0, str(ROOT))
    try:
        yield importlib.import_module("vllm")
    finally:
        sys.path.remove(str(ROOT))
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]


@dataclass
class Step:
    """One forward's inputs for one layer's indexer, and what the indexer saw (filled by `run`)."""

    metadata: Any
    q: torch.Tensor  # (tokens, HEADS, DIM)
    weights: torch.Tensor  # (tokens, HEADS)
    tokens: int
    seen: list[torch.Tensor] = field(default_factory=list)  # logits handed to the top-k, as computed


def prefill_step(requests: list[tuple[int, int]], kv_cache: torch.Tensor, *, ratio: int = 1, seed: int = 0,
                 row_shard_sizes: list[int] | None = None, sparse: tuple[int, int, int] | None = None) -> Step:
    """One chunk of `requests` = [(seq_len, query_len), ...] (uncompressed lengths; the chunk's queries are
    the last `query_len` tokens of each). Request b's compressed keys are rows of `kv_cache` starting at
    the sum of the earlier requests' compressed lengths. `sparse` = (num_sparse, topk, sparse_block_kv)
    adds V4.1's sparse-logits scratch."""
    from vllm.v1.attention.backends.mla.indexer import (
        DeepseekV32IndexerMetadata,
        DeepseekV32IndexerPrefillChunkMetadata,
        DeepseekV32IndexerPrefillMetadata,
    )

    device = kv_cache.device
    ks, ke, cu, rows_of_keys = [], [], [0], []
    for seq_len, query_len in requests:
        compressed = seq_len // ratio
        start_pos = seq_len - query_len
        for offset in range(query_len):
            ks.append(cu[-1])
            ke.append(cu[-1] + (start_pos + 1 + offset) // ratio)
        rows_of_keys.extend(range(cu[-1], cu[-1] + compressed))
        cu.append(cu[-1] + compressed)
    tokens = len(ks)
    i32 = dict(dtype=torch.int32, device=device)
    chunk = DeepseekV32IndexerPrefillChunkMetadata(
        block_table=torch.tensor(rows_of_keys, **i32), cu_seqlen_ks=torch.tensor(ks, **i32),
        cu_seqlen_ke=torch.tensor(ke, **i32), cu_seq_lens=torch.tensor(cu, **i32),
        token_to_seq=torch.tensor([b for b, (_, n) in enumerate(requests) for _ in range(n)], **i32),
        total_seq_lens=cu[-1], max_seqlen_k=max(s // ratio for s, _ in requests), token_start=0,
        token_end=tokens, num_reqs=len(requests), local_cu_seq_lens=torch.tensor(cu, **i32),
        local_total_seq_lens=cu[-1], max_local_total_seq_lens=cu[-1])
    metadata = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor([s for s, _ in requests], **i32), max_seq_len=max(s for s, _ in requests),
        slot_mapping=torch.zeros(tokens, **i32), num_decodes=0, num_decode_tokens=0, num_prefills=len(requests),
        num_prefill_tokens=tokens, prefill=DeepseekV32IndexerPrefillMetadata([chunk],
                                                                             row_shard_sizes=row_shard_sizes))
    if sparse is not None:
        from vllm.model_executor.layers.sparse_mqa_indexer import SparseChunkRows

        num_sparse, topk, block_kv = sparse
        metadata.sparse_block_kv = block_kv  # type: ignore[attr-defined]
        metadata.sparse_prefill = [SparseChunkRows(tokens, num_sparse, topk, device)]  # type: ignore[attr-defined]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, HEADS, DIM, generator=g).to(device)
    weights = torch.rand(tokens, HEADS, generator=g).to(device)
    return Step(metadata, q, weights, tokens)


def decode_step(seq_lens: list[int], kv_cache: torch.Tensor, *, next_n: int = 1, per_row: bool = True,
                max_seq_len: int | None = None, seed: int = 0) -> Step:
    """One uniform decode batch as the builder leaves it (mla/indexer.py l.1263-1281, l.1741-1764): request b
    has `seq_lens[b]` keys (rows of `kv_cache` after the earlier requests'), `next_n` query tokens; its
    `seq_lens` row is (next_n,) per-row lengths `(L - next_n + 1 + j).clamp(0)` with native MTP
    (`per_row`), else (L,). `max_seq_len` is the host bound (default: the longest request)."""
    from vllm.v1.attention.backends.mla.indexer import (
        DeepSeekV32IndexerDecodeMetadata,
        DeepseekV32IndexerMetadata,
    )

    device = kv_cache.device
    i32 = dict(dtype=torch.int32, device=device)
    width = max(seq_lens)
    firsts = [sum(seq_lens[:b]) for b in range(len(seq_lens))]
    block_table = torch.tensor([[f + min(p, n - 1) if n else 0 for p in range(width)]
                                for f, n in zip(firsts, seq_lens, strict=True)], **i32)
    lens = torch.tensor(seq_lens, **i32)[:, None]
    if per_row and next_n > 1:
        lens = (lens - next_n + 1 + torch.arange(next_n, **i32)).clamp(min=0)
    batch = len(seq_lens)
    tokens = batch * next_n
    decode = DeepSeekV32IndexerDecodeMetadata(block_table, lens, torch.full((batch,), next_n, **i32))
    metadata = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor(seq_lens, **i32), max_seq_len=max_seq_len or width,
        slot_mapping=torch.zeros(tokens, **i32), num_decodes=batch, num_decode_tokens=tokens, num_prefills=0,
        num_prefill_tokens=0, decode=decode)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, HEADS, DIM, generator=g).to(device)
    weights = torch.rand(tokens, HEADS, generator=g).to(device)
    return Step(metadata, q, weights, tokens)


def run(layer: Any, step: Step) -> None:
    """`layer._sparse_indexer_and_attn(...)` inside a forward context whose `attn_metadata` maps the layer's
    index K cache prefix to the step's metadata; records in `step.seen` the logits the scoring kernels
    returned (before any candidate masking), with their row stride."""
    from vllm import forward_context
    from vllm.model_executor.kernels.attention.dsa import sparse_mqa_logits
    from vllm.model_executor.layers import sparse_attn_indexer

    def spy(module: Any, name: str) -> Any:
        original = getattr(module, name)

        def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
            out = original(*args, **kwargs)
            kept = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)
            step.seen.append(kept.copy_(out))
            return out

        setattr(module, name, kernel)
        return original

    spied = [(m, n, spy(m, n)) for m, n in ((sparse_attn_indexer, "fp8_fp4_mqa_logits"),
                                            (sparse_attn_indexer, "fp8_fp4_paged_mqa_logits"),
                                            (sparse_mqa_logits, "fp8_fp4_sparse_mqa_logits"))]
    sparse = getattr(step.metadata, "sparse_prefill", None) is not None
    q_scale = torch.ones(step.q.shape[:2], device=step.q.device) if sparse else None
    try:
        with forward_context.set_forward_context({layer.indexer.k_cache.prefix: step.metadata}):
            layer._sparse_indexer_and_attn(torch.zeros(step.tokens, 8), step.q, q_scale, step.weights)
    finally:
        for module, name, original in spied:
            setattr(module, name, original)


def v41_model(n_layers: int, *, kv_sources: tuple[int, ...], index_sources: tuple[int, ...],
              candidate_source: int, sparse_logits: bool, ratio: int, top_k: int, keys: int,
              candidate_topk_blocks: int = 4, candidate_block_size: int = 16, tokens: int = 64,
              seed: int = 1, device: str = "cpu") -> list[Any]:
    """DeepSeek V4.1 attention layers `model.layers.N.self_attn` sharing one topk buffer and one candidate
    buffer, with the given kv / index / candidate source topology."""
    from vllm.models.deepseek_v41.attention import DeepseekV41Attention

    config = SimpleNamespace(compress_ratios=[ratio] * n_layers, kv_source_layer_ids=list(kv_sources),
                             index_source_layer_ids=list(index_sources), candidate_source_layer_id=candidate_source,
                             candidate_block_size=candidate_block_size, index_topk=top_k,
                             indexer_sparse_logits=sparse_logits)
    g = torch.Generator().manual_seed(seed)
    kv_cache = torch.randn(keys, DIM, generator=g).to(device)
    topk_buffer = torch.empty(tokens, top_k, dtype=torch.int32, device=device)
    candidates = torch.empty(tokens, candidate_topk_blocks, dtype=torch.int32, device=device)
    context: dict[str, Any] = {}
    return [DeepseekV41Attention(f"model.layers.{i}.self_attn", i, config, context, topk_buffer, candidates, kv_cache)
            for i in range(n_layers)]
