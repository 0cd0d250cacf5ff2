"""Steps through the released `SparseMQAIndexer` (DeepSeek V4.1's candidate consumers with
`attention_config.indexer_sparse_logits`, vLLM 0.33 and 0.34): requests whose keys and queries MXFP4
represents exactly, their indexer cache, the candidate blocks the source layer published, the metadata the
`DeepseekV41SparseIndexerBackend` builder would hand the layer (the released dataclasses, the builder's
scratch laid out as it lays it out), and the layer called as the V4.1 attention calls it.

Row facts: a row of request b at position p scores the request's keys [0, p + 1); its candidate block c
(units of `CANDIDATE_BLOCK` keys) covers keys [c * CANDIDATE_BLOCK, (c + 1) * CANDIDATE_BLOCK) of the
request. The sparse logits' column j * sbk + o scores the row's j-th candidate sparse block (ascending),
key o of it: `sparse_columns` recomputes which key each valid column scores.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch

from tests.engine_fakes.vllm import prefill
from tests.engine_fakes.vllm.edges import score, set_forward_context
from tests.engine_fakes.vllm.prefill import Request
from tests.engine_fakes.vllm.sparse_edges import E2M1, GRANULE, D, pack_mxfp4

HEADS, PAGE = 4, 64  # PAGE * (D/2 + D/32) bytes: a 256-byte aligned page, as the paged kernel wants
CANDIDATE_BLOCK, CANDIDATES, TOP_K = 32, 16, 64  # 16 candidates of 32 keys: 512 bf16 columns (1024 B rows)
SPARSE_BLOCK_KV = 16  # the largest of DeepGEMM's sparse block sizes (16, 8) dividing CANDIDATE_BLOCK
INDEXER = "vllm.model_executor.layers.sparse_mqa_indexer"
KERNELS = "vllm.model_executor.kernels.attention.dsa.sparse_mqa_logits"
BACKEND = "vllm.v1.attention.backends.mla.sparse_indexer"
PREFIX = prefill.PREFIX


@dataclass
class SparseStep:
    step: prefill.Step  # the rows' true queries (fp32), bf16 weights, true keys, the cache, the page table
    q_quant: Any  # as the fused Q kernel hands it: (codes, int32 scales) for MXFP4, the values for FP8
    candidates: torch.Tensor  # (tokens, CANDIDATES) int32 request-local candidate blocks, -1 padded
    kv_dtype: str


def on_grid(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """Random values MXFP4 represents exactly: signed e2m1 magnitudes times a power of two per 32."""
    codes = torch.randint(0, 8, shape, generator=g)
    signs = 1 - 2 * torch.randint(0, 2, shape, generator=g)
    powers = torch.randint(-2, 2, (*shape[:-1], shape[-1] // GRANULE, 1), generator=g).float()
    values = (E2M1[codes] * signs).reshape(*shape[:-1], -1, GRANULE) * torch.exp2(powers)
    return values.reshape(shape)


def _cache(keys: list[torch.Tensor], table: torch.Tensor, kv_dtype: str, g: torch.Generator) -> torch.Tensor:
    """The indexer cache in the fake's layout of `kv_dtype` (tests/engine_fakes/vllm/sparse_edges.py)."""
    pages = int(table.max()) + 1
    if kv_dtype == "mxfp4":
        cache = torch.zeros(pages, PAGE, D // 2 + D // GRANULE, dtype=torch.uint8)
        encoded = [torch.cat(pack_mxfp4(k), -1) for k in keys]
    else:
        cache = torch.zeros(pages, PAGE, D + 1)
        exponents = [torch.randint(-1, 2, (k.shape[0], 1), generator=g).float() for k in keys]
        encoded = [torch.cat([k * torch.exp2(-e), e], -1) for k, e in zip(keys, exponents, strict=True)]
    for b, rows in enumerate(encoded):
        for t in range(rows.shape[0]):
            cache[int(table[b, t // PAGE]), t % PAGE] = rows[t]
    return cache


def _candidates(owner: list[tuple[int, int]], g: torch.Generator) -> torch.Tensor:
    """Each row's published candidate blocks: distinct blocks of its keys in random order, -1 padded, one
    block past its keys (the expansion drops it), every fifth row with one block only, row 3 with none."""
    out = torch.full((len(owner), CANDIDATES), -1, dtype=torch.int32)
    for r, (_, p) in enumerate(owner):
        blocks = -(-(p + 1) // CANDIDATE_BLOCK)
        count = 0 if r == 3 else 1 if r % 5 == 0 else min(blocks, CANDIDATES - 3)
        picked = torch.randperm(blocks, generator=g)[:count].tolist() + [blocks + 1]
        out[r, :len(picked)] = torch.tensor(picked, dtype=torch.int32)
        out[r] = out[r, torch.randperm(CANDIDATES, generator=g)]
    return out


def make_step(requests: list[Request], kv_dtype: str, seed: int = 0) -> SparseStep:
    g = torch.Generator().manual_seed(seed)
    tokens = sum(r.query for r in requests)
    keys = [on_grid((r.seq_len, D), g) for r in requests]
    q = on_grid((tokens, HEADS, D), g)
    weights = (torch.rand(tokens, HEADS, generator=g) + 0.5).to(torch.bfloat16)
    per = max(-(-r.seq_len // PAGE) for r in requests)
    table = torch.randperm(per * len(requests), generator=g).reshape(len(requests), per).to(torch.int32)
    owner = [(b, r.context + i) for b, r in enumerate(requests) for i in range(r.query)]
    step = prefill.Step(requests, q, weights, keys, [torch.ones(r.seq_len) for r in requests],
                        _cache(keys, table, kv_dtype, g), table, owner)
    if kv_dtype == "mxfp4":
        codes, scales = pack_mxfp4(q)
        q_quant: Any = (codes, scales.view(torch.int32).squeeze(-1))
    else:
        q_quant = q.clone()  # FP8 Q (fp32 here); its unit scales come from `mqa_logits_mx_inputs`
    return SparseStep(step, q_quant, _candidates(owner, g), kv_dtype)


def _scratch(rows: int, sbk: int) -> dict[str, torch.Tensor]:
    """The builder's per-row scratch of one call: sparse block ids, valid columns, the column top-k."""
    sparse = CANDIDATES * (CANDIDATE_BLOCK // sbk)
    return {"sparse_indices": torch.zeros(rows, sparse, dtype=torch.int32),
            "end": torch.zeros(rows, dtype=torch.int32),
            "col_indices": torch.zeros(rows, TOP_K, dtype=torch.int32)}


def _sparse_metadata(base: Any, sbk: int, **sparse: Any) -> Any:
    backend = __import__(BACKEND, fromlist=["x"])
    inherited = {name: getattr(base, name) for name in type(base).__dataclass_fields__}
    return backend.DeepseekV41SparseIndexerMetadata(**inherited, sparse_block_kv=sbk, **sparse)


def block_kv() -> int:
    """The sparse block size, as the released builder picks it for `CANDIDATE_BLOCK`."""
    picked = int(__import__(KERNELS, fromlist=["x"]).pick_sparse_block_kv(CANDIDATE_BLOCK))
    assert picked == SPARSE_BLOCK_KV
    return picked


def metadata(s: SparseStep, chunks: list[Any]) -> Any:
    """A prefill step's metadata: the dense chunks' and, per chunk, its rows' scratch."""
    backend = __import__(BACKEND, fromlist=["x"])
    sbk = block_kv()
    rows = [backend.SparseMQARowsMetadata(row_ks=c.cu_seqlen_ks, row_ke=c.cu_seqlen_ke,
                                          **_scratch(c.token_end - c.token_start, sbk)) for c in chunks]
    return _sparse_metadata(prefill.metadata(s.step, chunks), sbk, sparse_prefill=rows)


def decode_metadata(s: SparseStep) -> Any:
    """A decode step of every request, its last token one row: context lengths and page tables per row."""
    backend = __import__(BACKEND, fromlist=["x"])
    sbk, batch = block_kv(), len(s.step.requests)
    lengths = torch.tensor([r.seq_len for r in s.step.requests], dtype=torch.int32)
    rows = backend.SparseMQARowsMetadata(row_ks=torch.zeros(batch, dtype=torch.int32), row_ke=lengths,
                                         block_table=s.step.block_table,
                                         row_indices=torch.arange(batch, dtype=torch.int32), **_scratch(batch, sbk))
    return _sparse_metadata(prefill.decode_metadata(s.step, 1, False), sbk, sparse_decode=rows)


class Indexer:
    """A V4.1 indexer as the plugin sees it: its name, its compress ratio and its op."""

    def __init__(self, layer: int, op: Any) -> None:
        self.prefix = f"model.layers.{layer}.self_attn.indexer"
        self.compress_ratio = 4
        self.indexer_op = op


class Attention:
    """A V4.1 candidate consumer over the step tokens `rows` (a decode step's: each request's last): its
    indexer runs the released `SparseMQAIndexer` on the key cache of `cache_layer`, called as the V4.1
    attention layer calls it."""

    def __init__(self, layer: int, cache_layer: int, s: SparseStep, buffer: torch.Tensor, rows: Any = slice(None)) -> None:
        module = __import__(INDEXER, fromlist=["x"])
        cache = types.SimpleNamespace(prefix=PREFIX.format(cache_layer), kv_cache=s.step.kv_cache)
        op = module.SparseMQAIndexer(cache, TOP_K, D, 4096, buffer, s.candidates[rows], CANDIDATE_BLOCK)
        self.indexer = Indexer(layer, op)
        self.candidate_source_layer = cache_layer
        self.rows = rows

    def forward(self, s: SparseStep, meta: Any) -> None:
        rows = self.rows
        q_quant = tuple(t[rows] for t in s.q_quant) if isinstance(s.q_quant, tuple) else s.q_quant[rows]
        weights = s.step.weights[rows]
        with set_forward_context({self.indexer.indexer_op.k_cache.prefix: meta}):
            self.indexer.indexer_op(torch.zeros(weights.shape[0], 8), q_quant, None, weights)


def sparse_columns(s: SparseStep, token: int) -> list[int]:
    """The request-local keys the valid sparse columns of a step token's row score, in column order."""
    _, p = s.step.owner[token]
    sbk = SPARSE_BLOCK_KV
    ratio = CANDIDATE_BLOCK // sbk
    inside = -(-(p + 1) // sbk)
    blocks = sorted({ratio * c + i for c in s.candidates[token].tolist() if c >= 0 for i in range(ratio)}
                    & set(range(inside)))
    return [key for block in blocks for key in range(block * sbk, min((block + 1) * sbk, p + 1))]


def expected(s: SparseStep, token: int, keys: list[int] | None = None) -> torch.Tensor:
    """A step token's sparse logits row (bf16), recomputed from the step's inputs: its request's keys at
    `keys` (default: `sparse_columns`)."""
    b, _ = s.step.owner[token]
    chosen = sparse_columns(s, token) if keys is None else keys
    if not chosen:
        return torch.empty(0, dtype=torch.bfloat16)
    return score(s.step.q[token:token + 1], s.step.keys[b][chosen], torch.ones(len(chosen)),
                 s.step.weights[token:token + 1])[0].to(torch.bfloat16)


__all__ = ["Attention", "SparseStep", "decode_metadata", "expected", "make_step", "metadata", "sparse_columns"]
