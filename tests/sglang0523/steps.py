"""Builds SGLang 0.5.23 forwards the way its DSA backend lays them out, and runs them through the stand-in
tree's real call path (ModelRunner.forward -> DeepseekV2ForCausalLM -> model.layers.N.self_attn.indexer ->
Indexer._get_topk_paged / _get_topk_ragged -> DSAIndexerMetadata.topk_transform -> DSATopKBackend).

Layout (dsa_backend.py): pages of 64 tokens handed out in shuffled order, so no page table is the
identity; `real_page_table` (batch, pages) and `page_table_1` (batch, pages * 64) slots. Decode row r of
request b attends to seq_len - next_n + 1 + r % next_n keys from column 0 (target verify expands the page
tables per row). Extend row i of request b (query position p = seq_len - extend_len + i) attends to the
batch's flattened keys [ks, ks + p + 1), ks = the keys of the requests before b (`cu_seqlens_k`), and
RAGGED offsets are `repeat_interleave(cu_seqlens_k[:-1], extend_lens)`.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

ROOT = Path(__file__).parent
PAGE, TOP_K, LAYERS = 64, 8, 2
CONFIG = SimpleNamespace(hidden_size=32, q_lora_rank=24, index_n_heads=4, index_head_dim=16, index_topk=TOP_K,
                         vocab_size=97, num_hidden_layers=LAYERS)
INDEXER = "model.layers.{}.self_attn.indexer"


@contextmanager
def sglang_on_path() -> Iterator[Any]:
    """The stand-in `sglang` and `sgl_kernel` importable for the block, dropped from sys.modules after."""
    sys.path.insert(0, str(ROOT))
    try:
        yield importlib.import_module("sglang")
    finally:
        sys.path.remove(str(ROOT))
        for name in [m for m in sys.modules if m.split(".")[0] in ("sglang", "sgl_kernel")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def sglang0523() -> Iterator[Any]:
    with sglang_on_path() as sglang:
        yield sglang


@pytest.fixture
def fresh_sglang(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """TP rank 0 of 1 without DP attention, default switches, no recorded model, no forward's KV pool
    published (as in a fresh scheduler process: a test must not run on an earlier test's pool); the
    capture is removed."""
    from sglang.srt.model_executor.forward_context import set_token_to_kv_pool

    from logitreplay.capture import serving, sglang_plugin

    publish(0, 1)
    set_token_to_kv_pool(None)
    for name in ("SGLANG_DSA_FUSE_TOPK", "SGLANG_OPT_USE_TOPK_V2", "SGLANG_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(serving.ENV_MODEL, raising=False)
    sglang_plugin._model_facts.cache_clear()
    yield
    if serving._active is not None:
        serving._active.uninstall()


def publish(tp_rank: int, tp_size: int, dp_size: int = 1) -> None:
    """The ranks a scheduler process publishes (`runtime_context.derive_attention_ranks`)."""
    from sglang.srt.runtime_context import get_parallel

    attn_tp_size = tp_size // dp_size
    get_parallel().clear_stamp()
    get_parallel().override_permanently(tp_rank=tp_rank, tp_size=tp_size, attn_tp_rank=tp_rank % attn_tp_size,
                                        attn_tp_size=attn_tp_size, attn_dp_rank=tp_rank // attn_tp_size,
                                        attn_dp_size=dp_size)


@dataclass
class Pool:
    """The index-K part of `DSATokenToKVPool`: each layer's keys by KV slot."""

    index_page_size: int
    index_k: list[torch.Tensor]
    free_pages: list[int]

    def get_index_k_scale_buffer(self, layer_id: int, seq_lens: torch.Tensor, block_tables: torch.Tensor,
                                 seq_len_sum: int, max_seq_len: int) -> torch.Tensor:
        """Every request's keys, in order (the batch's flattened KV), gathered through its pages."""
        device = seq_lens.device
        lens = seq_lens.to(torch.int64)
        batch = torch.repeat_interleave(torch.arange(lens.shape[0], device=device), lens, output_size=seq_len_sum)
        first = torch.cumsum(lens, 0) - lens
        pos = torch.arange(seq_len_sum, device=device) - first[batch]
        slots = block_tables[batch, pos // self.index_page_size].to(torch.int64) * self.index_page_size
        return self.index_k[layer_id][slots + pos % self.index_page_size]


def build(device: str = "cpu", pages: int = 32, seed: int = 0) -> Any:
    """A ModelRunner over the stand-in DeepSeek V3.2 and a pool of `pages` shuffled pages."""
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = DeepseekV2ForCausalLM(CONFIG).to(device)
    keys = [torch.randn(pages * PAGE, CONFIG.index_head_dim, generator=g).to(device) for _ in range(LAYERS)]
    pool = Pool(PAGE, keys, torch.randperm(pages, generator=g).tolist())
    return ModelRunner(model, device, pool)


def decode_batch(runner: Any, seq_lens: list[int], next_n: int = 1, backend: str = "sgl-kernel",
                 seed: int = 0) -> Any:
    """A decode (next_n 1) or target-verify (next_n > 1) batch over requests of `seq_lens` keys."""
    from sglang.kernels.ops.attention.dsv4.topk import plan_topk_v2
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    device = runner.device
    real, page_table_1 = _tables(runner.token_to_kv_pool, seq_lens, device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    rows = len(seq_lens) * next_n
    expanded = (lens[:, None] - next_n + 1 + torch.arange(next_n, dtype=torch.int32, device=device)).reshape(-1)
    if next_n > 1:  # verify: one page-table row per query row
        real, page_table_1 = (t.repeat_interleave(next_n, 0, output_size=rows) for t in (real, page_table_1))
    meta = _metadata(cache_seqlens_int32=lens, cu_q=torch.arange(0, rows + 1, 1 if next_n > 1 else next_n,
                                                                 dtype=torch.int32, device=device),
                     lens=lens, real=real, page_table_1=page_table_1, expanded=expanded,
                     extend=[next_n] * len(seq_lens), plan=plan_topk_v2(expanded))
    mode = ForwardMode.DECODE if next_n == 1 else ForwardMode.TARGET_VERIFY
    return _batch(mode, meta, seq_lens, [next_n] * len(seq_lens), backend, rows, ragged=False, seed=seed)


def extend_batch(runner: Any, requests: list[tuple[int, int]], backend: str = "sgl-kernel", ragged: bool = True,
                 seed: int = 0) -> Any:
    """An extend batch of `requests` = [(seq_len, extend_len)]: the last extend_len tokens of each are new.
    `ragged`: the RAGGED method (fp8 KV cache with flashmla_sparse prefill), else PAGED."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    device = runner.device
    seq_lens = [s for s, _ in requests]
    extend = [e for _, e in requests]
    real, page_table_1 = _tables(runner.token_to_kv_pool, seq_lens, device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    ext = torch.tensor(extend, dtype=torch.int32, device=device)
    rows = sum(extend)
    cu_k = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    batch_of = torch.repeat_interleave(torch.arange(len(requests), device=device), ext, output_size=rows)
    first_row = torch.cumsum(ext, 0) - ext
    position = (lens - ext)[batch_of] + torch.arange(rows, device=device) - first_row[batch_of]
    expanded = (position + 1).to(torch.int32)
    ks = cu_k[:-1][batch_of]
    meta = _metadata(cache_seqlens_int32=lens, cu_q=torch.nn.functional.pad(torch.cumsum(ext, 0, dtype=torch.int32),
                                                                            (1, 0)),
                     lens=lens, real=real, page_table_1=page_table_1, expanded=expanded, extend=extend,
                     cu_k=cu_k, offsets=torch.repeat_interleave(cu_k[:-1], ext, output_size=rows) if ragged else None,
                     k_range=(ks, ks + expanded), batch_idx=batch_of.to(torch.int32))
    return _batch(ForwardMode.EXTEND, meta, seq_lens, extend, backend, rows, ragged=ragged, seed=seed)


def _tables(pool: Pool, seq_lens: list[int], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Pages for each request from the pool's shuffled free list: (real_page_table, page_table_1)."""
    counts = [math.ceil(s / PAGE) for s in seq_lens]
    width = max(counts)
    real = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    taken = 0
    for b, n in enumerate(counts):
        real[b, :n] = torch.tensor(pool.free_pages[taken: taken + n], dtype=torch.int32)
        taken += n
    assert taken <= len(pool.free_pages), "pool too small"
    col = torch.arange(width * PAGE)
    page_table_1 = (real[:, col // PAGE] * PAGE + col % PAGE).to(torch.int32)
    return real.to(device), page_table_1.to(device)


def _metadata(*, cache_seqlens_int32: torch.Tensor, cu_q: torch.Tensor, lens: torch.Tensor, real: torch.Tensor,
              page_table_1: torch.Tensor, expanded: torch.Tensor, extend: list[int], plan: torch.Tensor | None = None,
              cu_k: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
              k_range: tuple[torch.Tensor, torch.Tensor] | None = None, batch_idx: torch.Tensor | None = None) -> Any:
    from sglang.srt.layers.attention.dsa_backend import DSAMetadata

    if cu_k is None:
        cu_k = torch.nn.functional.pad(torch.cumsum(lens, 0, dtype=torch.int32), (1, 0))
    return DSAMetadata(page_size=PAGE, cache_seqlens_int32=cache_seqlens_int32, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                       page_table_1=page_table_1, real_page_table=real, dsa_seqlens_expanded=expanded,
                       dsa_extend_seq_lens_list=extend, topk_v2_plan=plan, topk_indices_offset=offsets,
                       indexer_k_start_end=k_range, indexer_seq_lens_cpu=lens.cpu(), indexer_seq_lens=lens,
                       token_to_batch_idx=batch_idx)


def _batch(mode: Any, meta: Any, seq_lens: list[int], extend: list[int], backend: str, rows: int, *, ragged: bool,
           seed: int) -> Any:
    from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend
    from sglang.srt.layers.attention.dsa_backend import DeepseekSparseAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    device = meta.cache_seqlens_int32.device
    g = torch.Generator().manual_seed(1000 + seed)
    attn = DeepseekSparseAttnBackend(meta, DSATopKBackend(backend), dsa_kv_cache_store_fp8=ragged)
    return ForwardBatch(mode, len(seq_lens), meta.cache_seqlens_int32,
                        meta.cache_seqlens_int32.cpu(), list(extend), attn,
                        {"input_ids": torch.randint(0, CONFIG.vocab_size, (rows,), generator=g).to(device),
                         "positions": torch.zeros(rows, dtype=torch.int64, device=device)})


@dataclass
class Seen:
    """What each indexer call handed to `topk_transform` (a copy taken just before it) and what it returned."""

    logits: list[torch.Tensor]
    results: list[torch.Tensor]


@contextmanager
def watched(monkeypatch: pytest.MonkeyPatch) -> Iterator[Seen]:
    """Record the logits the top-k reads (the indexer's last step before it, `_mask_init_and_local_tokens`,
    gets the same tensor) and the production output."""
    from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
    from sglang.srt.layers.attention.dsa.dsa_topk_backend import DSATopKBackend

    seen = Seen([], [])
    mask, transform = Indexer._mask_init_and_local_tokens, DSATopKBackend.topk_transform

    def spy_mask(self: Any, logits: torch.Tensor, *args: Any) -> Any:
        seen.logits.append(logits.clone())
        return mask(self, logits, *args)

    def spy_transform(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = transform(self, *args, **kwargs)
        seen.results.append(out.clone())
        return out

    monkeypatch.setattr(Indexer, "_mask_init_and_local_tokens", spy_mask)
    monkeypatch.setattr(DSATopKBackend, "topk_transform", spy_transform)
    yield seen
