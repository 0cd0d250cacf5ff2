"""Forwards through the released SGLang indexer: a small DSA model, its index-K pool and the metadata
SGLang's DSA attention backend builds for a decode, target-verify or extend batch.

The model (`model.layers.N.self_attn.indexer`, the module path SGLang's DeepSeek V3.2 / GLM-5 models give
the indexer) holds one released `Indexer` per layer, built without its projections: each attention layer
hands it the batch's fp8 queries and head weights, then takes the branch `Indexer.forward_cuda` takes after
its projections: the K-only path when `_should_skip_logits_computation` says every key is selected,
`_get_topk_paged` for decode, target verify and draft extend, `_get_topk_ragged` for extend. Everything from there to the
top-k kernel is SGLang's.

The pool holds every request's keys in 64-token pages handed out in shuffled order (no page table is the
identity), quantized to fp8 with one scale per key, in the layout `kernels.split_page` reads; `keys` keeps
the same keys dequantized per request, for the tests' own recomputation of the logits.

Layout facts (SGLang's DSA backend): decode row b attends to its request's seq_len keys; target-verify row
(b, j) of next_n to seq_len - next_n + 1 + j, with the page tables repeated per row; extend row i of
request b (query position p) to the batch's flattened keys [ks, ks + p + 1), ks = the keys of the requests
before b, and RAGGED offsets are those ks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.engine_fakes.sglang.kernels import HEAD_DIM
from tests.engine_fakes.sglang.topk import plan_topk_v2

PAGE, TOP_K, LAYERS, HEADS = 64, 16, 2, 4
INDEXER = "model.layers.{}.self_attn.indexer"
FP8_MAX = 448.0


class Indexed(torch.Tensor):
    """A CPU tensor that reports device index 0: SGLang's ragged path sizes its logits budget per CUDA
    device index (`q_fp8.device.index`), which a CPU tensor lacks."""

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cpu", 0)


@dataclass
class Pool:
    """The index-K part of SGLang's DSA token pool: per layer, pages of 64 keys + scales (bytes)."""

    pages: list[torch.Tensor]
    free: list[int]
    index_page_size: int = PAGE
    # request id -> (dequantized keys (seq_len, 128) per layer) for the tests' recomputation
    keys: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        return self.pages[layer_id]

    def get_index_k_scale_buffer(self, layer_id: int, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                                 seq_len_sum: int, max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Every request's keys in order (the batch's flattened keys): fp8 bytes (sum, 128), scale bytes (sum, 4)."""
        data, scales = [], []
        page = self.pages[layer_id]
        for b, n in enumerate(seq_lens.tolist()):
            slots = torch.arange(n)
            pages = block_tables[b, slots // PAGE].long()
            data.append(page[pages].view(-1, PAGE * (HEAD_DIM + 4))[:, : PAGE * HEAD_DIM]
                        .reshape(-1, PAGE, HEAD_DIM)[torch.arange(n), slots % PAGE])
            scales.append(page[pages].view(-1, PAGE * (HEAD_DIM + 4))[:, PAGE * HEAD_DIM:]
                          .reshape(-1, PAGE, 4)[torch.arange(n), slots % PAGE])
        return torch.cat(data), torch.cat(scales)

    def store(self, layer: int, table: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """Quantize one request's keys into its pages; returns them dequantized."""
        scale = (keys.abs().amax(dim=1).clamp(min=1e-6) / FP8_MAX).float()
        fp8 = (keys / scale[:, None]).to(torch.float8_e4m3fn)
        buffer = self.pages[layer].view(-1, PAGE * (HEAD_DIM + 4))
        for t in range(keys.shape[0]):
            page, slot = int(table[t // PAGE]), t % PAGE
            buffer[page, slot * HEAD_DIM: (slot + 1) * HEAD_DIM] = fp8[t].view(torch.uint8)
            at = PAGE * HEAD_DIM + slot * 4
            buffer[page, at: at + 4] = scale[t: t + 1].view(torch.uint8)
        return fp8.float() * scale[:, None]


@dataclass
class DSAMetadata:
    """The fields of SGLang's `DSAMetadata` (`dsa_backend.py`) that the indexer and its top-k read."""

    page_size: int
    cache_seqlens_int32: torch.Tensor
    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    page_table_1: torch.Tensor
    real_page_table: torch.Tensor
    dsa_seqlens_expanded: torch.Tensor
    dsa_extend_seq_lens_list: list[int]
    token_to_batch_idx: torch.Tensor
    indexer_seq_lens: torch.Tensor
    indexer_seq_lens_cpu: torch.Tensor
    indexer_k_start_end: tuple[torch.Tensor, torch.Tensor] | None = None
    topk_indices_offset: torch.Tensor | None = None
    topk_v2_plan: torch.Tensor | None = None
    indexer_logical_page_table: torch.Tensor | None = None


@dataclass
class Backend:
    """The attention backend: its pool, and the indexer metadata of the forward it was last initialised
    for (`init_forward_metadata`, as SGLang's runner does before each forward), handed to every layer."""

    token_to_kv_pool: Pool
    plan: tuple[DSAMetadata, str, str] | None = None  # metadata, "PAGED" / "RAGGED", top-k backend

    def init_forward_metadata(self, batch: Any) -> None:
        self.plan = batch.inputs["dsa"]

    def get_indexer_metadata(self, layer_id: int, forward_batch: Any) -> Any:
        from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import DSAIndexerMetadata
        from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend, TopkTransformMethod

        assert self.plan is not None
        metadata, method, backend = self.plan
        return DSAIndexerMetadata(metadata, TopkTransformMethod[method], DSATopKBackend(backend))


class Attention(torch.nn.Module):
    def __init__(self, indexer: torch.nn.Module) -> None:
        super().__init__()
        self.indexer = indexer

    def forward(self, batch: Any) -> torch.Tensor:
        from sglang.srt.model_executor.forward_context import get_attn_backend

        ix = self.indexer
        layer_id = ix.layer_id
        metadata = get_attn_backend().get_indexer_metadata(layer_id, batch)
        if ix._should_skip_logits_computation(batch):
            return ix._forward_cuda_k_only(batch.inputs["x"], batch.inputs["positions"], batch, layer_id, None,
                                           metadata)
        q_fp8, weights = batch.inputs["q_fp8"][layer_id], batch.inputs["weights"][layer_id]
        mode = batch.forward_mode
        if mode.is_decode_or_idle() or mode.is_target_verify() or mode.is_draft_extend_v2():
            return ix._get_topk_paged(batch, layer_id, q_fp8, weights, metadata)
        return ix._get_topk_ragged(False, batch, layer_id, q_fp8, weights, metadata)


class Layer(torch.nn.Module):
    def __init__(self, indexer: torch.nn.Module) -> None:
        super().__init__()
        self.self_attn = Attention(indexer)


class Inner(torch.nn.Module):
    def __init__(self, indexers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(ix) for ix in indexers)


class Model(torch.nn.Module):
    """A causal LM's outer module: `model.layers.N.self_attn.indexer`; returns each layer's top-k result."""

    def __init__(self, indexers: list[torch.nn.Module]) -> None:
        super().__init__()
        self.model = Inner(indexers)

    def forward(self, batch: Any) -> list[torch.Tensor]:
        return [layer.self_attn(batch) for layer in self.model.layers]


def indexer(layer_id: int, budget_bytes: int | None = None) -> torch.nn.Module:
    """A released `Indexer` without its projections (its `__init__` builds the quantized linear layers):
    the attributes its top-k methods read, as SGLang's constructor sets them for DeepSeek V3.2."""
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang.srt.layers.attention.dsa.paged_mqa_logits_backend import DSAPagedMQALogitsBackend

    ix = Indexer.__new__(Indexer)
    torch.nn.Module.__init__(ix)
    ix.layer_id, ix.index_topk, ix.n_heads, ix.head_dim = layer_id, TOP_K, HEADS, HEAD_DIM
    ix.num_init_tokens = ix.num_local_tokens = 0
    ix.sm_count, ix.logits_with_pp_recv, ix.alt_stream = 8, False, None
    ix.paged_mqa_logits_backend = DSAPagedMQALogitsBackend.DEEPGEMM
    ix.use_dsa_indexer_fusion, ix.use_aiter_fused_fp8_writer, ix.dsa_enable_prefill_cp = True, False, False
    ix._mqa_logits_budget_bytes = {} if budget_bytes is None else {0: budget_bytes}
    # the K-only path's projection and cache store (kernels): the keys are already in the pool
    ix._fused_k_weights = lambda x: (x, None)
    ix._fused_k_prepare_and_store = lambda *args, **kwargs: None
    return ix


def build(pages: int = 48, seed: int = 0, budget_bytes: int | None = None) -> Any:
    """A model runner over a fresh pool of `pages` shuffled pages (runner.ModelRunner, imported by the
    module name SGLang gives it, where the plugin finds its step)."""
    from sglang.srt.model_executor.model_runner import ModelRunner

    g = torch.Generator().manual_seed(seed)
    pool = Pool([torch.zeros(pages, PAGE * (HEAD_DIM + 4), dtype=torch.uint8) for _ in range(LAYERS)],
                torch.randperm(pages, generator=g).tolist())
    model = Model([indexer(layer, budget_bytes) for layer in range(LAYERS)])
    return ModelRunner(model, Backend(pool))


@dataclass
class Forward:
    """A batch and what the tests need to recompute its logits: per layer the queries and weights the
    indexer got, per row its request and window in the request's keys."""

    batch: Any
    request_of_row: list[int]
    row_lengths: list[int]
    key_offsets: list[int]  # per row, its request's offset in the batch's flattened keys (extend)
    keys: list[list[torch.Tensor]]  # per layer, per request: dequantized keys


def _requests(runner: Any, seq_lens: list[int], g: torch.Generator) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
    """Pages for each request from the pool's shuffled free list and its keys in every layer."""
    pool: Pool = runner.attn_backend.token_to_kv_pool
    counts = [math.ceil(n / PAGE) for n in seq_lens]
    if sum(counts) > len(pool.free):
        raise ValueError("pool too small for this batch")
    table = torch.zeros(len(seq_lens), max(counts), dtype=torch.int32)
    taken = 0
    for b, n in enumerate(counts):
        table[b, :n] = torch.tensor(pool.free[taken: taken + n], dtype=torch.int32)
        taken += n
    keys = [[pool.store(layer, table[b], torch.randn(n, HEAD_DIM, generator=g)) for b, n in enumerate(seq_lens)]
            for layer in range(LAYERS)]
    return table, keys


def _inputs(rows: int, g: torch.Generator) -> dict[str, Any]:
    """Per layer: fp8 queries (rows, heads, 128) and fp32 head weights (rows, heads, 1)."""
    q = [torch.randn(rows, HEADS, HEAD_DIM, generator=g).to(torch.float8_e4m3fn).as_subclass(Indexed)
         for _ in range(LAYERS)]
    w = [torch.rand(rows, HEADS, 1, generator=g) for _ in range(LAYERS)]
    return {"q_fp8": q, "weights": w, "x": torch.zeros(rows, HEAD_DIM), "positions": torch.zeros(rows, dtype=torch.int64)}


def _pad(t: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.pad(torch.cumsum(t, 0, dtype=torch.int32), (1, 0))


def _slot_table(table: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(table.shape[1] * PAGE)
    return (table[:, cols // PAGE] * PAGE + cols % PAGE).to(torch.int32)


def decode(runner: Any, seq_lens: list[int], next_n: int = 1, topk_backend: str = "sgl-kernel",
           seed: int = 0, draft: bool = False) -> Forward:
    """A decode (next_n 1) or target-verify (next_n > 1, each request's last next_n tokens) batch; `draft`:
    the same rows as the draft model's extend (EAGLE v2's DRAFT_EXTEND_V2, also a paged top-k)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    g = torch.Generator().manual_seed(seed)
    table, keys = _requests(runner, seq_lens, g)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    rows = len(seq_lens) * next_n
    expanded = (lens[:, None] - next_n + 1 + torch.arange(next_n, dtype=torch.int32)).reshape(-1)
    per_row = table.repeat_interleave(next_n, 0) if next_n > 1 else table
    meta = DSAMetadata(PAGE, lens, torch.arange(rows + 1, dtype=torch.int32), _pad(lens), _slot_table(per_row),
                       per_row, expanded, [next_n] * len(seq_lens),
                       torch.arange(len(seq_lens), dtype=torch.int32).repeat_interleave(next_n), lens, lens.clone(),
                       topk_v2_plan=plan_topk_v2(expanded))
    mode = ForwardMode.DRAFT_EXTEND_V2 if draft else ForwardMode.DECODE if next_n == 1 else ForwardMode.TARGET_VERIFY
    return _forward(runner, mode, meta, seq_lens, [next_n] * len(seq_lens), "PAGED", topk_backend, rows, keys,
                    [b for b in range(len(seq_lens)) for _ in range(next_n)], expanded.tolist(), [0] * rows, g)


def extend(runner: Any, requests: list[tuple[int, int]], ragged: bool = True, topk_backend: str = "sgl-kernel",
           seed: int = 0) -> Forward:
    """An extend batch of `requests` = [(seq_len, extend_len)], the last extend_len tokens of each new.
    `ragged`: the RAGGED method (SGLang's choice with an fp8 KV cache), else PAGED."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    g = torch.Generator().manual_seed(seed)
    seq_lens, new = [s for s, _ in requests], [e for _, e in requests]
    table, keys = _requests(runner, seq_lens, g)
    lens, ext = torch.tensor(seq_lens, dtype=torch.int32), torch.tensor(new, dtype=torch.int32)
    rows = sum(new)
    request_of_row = torch.repeat_interleave(torch.arange(len(requests)), ext)
    first_row = torch.cumsum(ext, 0) - ext
    position = (lens - ext)[request_of_row] + torch.arange(rows) - first_row[request_of_row]
    expanded = (position + 1).to(torch.int32)
    cu_k = _pad(lens)
    ks = cu_k[:-1][request_of_row]
    meta = DSAMetadata(PAGE, lens, _pad(ext), cu_k, _slot_table(table), table, expanded, new,
                       request_of_row.to(torch.int32), lens, lens.clone(), indexer_k_start_end=(ks, ks + expanded),
                       topk_indices_offset=ks.clone() if ragged else None)
    return _forward(runner, ForwardMode.EXTEND, meta, seq_lens, new, "RAGGED" if ragged else "PAGED", topk_backend,
                    rows, keys, request_of_row.tolist(), expanded.tolist(), ks.tolist(), g)


def _forward(runner: Any, mode: Any, meta: DSAMetadata, seq_lens: list[int], new: list[int], method: str,
             topk_backend: str, rows: int, keys: list[list[torch.Tensor]], request_of_row: list[int],
             row_lengths: list[int], key_offsets: list[int], g: torch.Generator) -> Forward:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    lens = torch.tensor(seq_lens, dtype=torch.int32)
    inputs = {**_inputs(rows, g), "dsa": (meta, method, topk_backend)}
    batch = ForwardBatch(mode, len(seq_lens), lens, lens.clone(), list(new), runner.attn_backend, inputs,
                         torch.zeros(rows, dtype=torch.int64))
    return Forward(batch, request_of_row, row_lengths, key_offsets, keys)


__all__ = ["INDEXER", "LAYERS", "PAGE", "TOP_K", "Forward", "build", "decode", "extend"]
