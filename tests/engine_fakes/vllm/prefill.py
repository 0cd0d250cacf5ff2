"""Prefill steps through the released `sparse_attn_indexer`: requests, their keys in the fake cache, the
indexer metadata vLLM's builder would hand the op (the released dataclasses), and the op called with
its own arguments.

Row facts (vLLM's DSA prefill): query token p of request b (its position in the request) attends to the
request's keys [0, p + 1); in a chunk, `cu_seq_lens` offsets each request's keys in the gathered key
buffer, and a row of request b has `ks = cu_seq_lens[b]`, `ke = ks + p + 1`. The logits are compressed
(row i's keys from column 0), so a row's bounds are [0, ke - ks).
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import torch

from tests.engine_fakes.vllm.edges import HEAD_DIM, set_forward_context

HEADS, BLOCK, TOP_K = 4, 16, 8
PREFIX = "model.layers.{}.self_attn.indexer.k_cache"
INDEXER = "vllm.model_executor.layers.sparse_attn_indexer"
BACKEND = "vllm.v1.attention.backends.mla.indexer"


@dataclass
class Request:
    context: int  # tokens already in the cache before this step
    query: int  # tokens this step adds

    @property
    def seq_len(self) -> int:
        return self.context + self.query


@dataclass
class Step:
    """One step's prefill for one layer: the rows (step tokens), their requests and positions."""

    requests: list[Request]
    q: torch.Tensor  # (tokens, HEADS, HEAD_DIM), one row per step token
    weights: torch.Tensor  # (tokens, HEADS)
    keys: list[torch.Tensor]  # per request (seq_len, HEAD_DIM)
    scales: list[torch.Tensor]  # per request (seq_len,)
    kv_cache: torch.Tensor
    block_table: torch.Tensor  # (requests, blocks)
    owner: list[tuple[int, int]]  # step token -> (request, position)


def make_step(requests: list[Request], seed: int = 0) -> Step:
    g = torch.Generator().manual_seed(seed)
    tokens = sum(r.query for r in requests)
    keys = [torch.randn(r.seq_len, HEAD_DIM, generator=g) for r in requests]
    scales = [torch.rand(r.seq_len, generator=g) + 0.5 for r in requests]
    per = max(-(-r.seq_len // BLOCK) for r in requests)
    order = torch.randperm(per * len(requests), generator=g)
    block_table = order.reshape(len(requests), per).to(torch.int32)
    kv_cache = torch.zeros(per * len(requests), BLOCK, HEAD_DIM + 1)
    for b, r in enumerate(requests):
        for t in range(r.seq_len):
            kv_cache[int(block_table[b, t // BLOCK]), t % BLOCK] = torch.cat([keys[b][t], scales[b][t:t + 1]])
    owner = [(b, r.context + i) for b, r in enumerate(requests) for i in range(r.query)]
    return Step(requests, torch.randn(tokens, HEADS, HEAD_DIM, generator=g), torch.rand(tokens, HEADS, generator=g),
                keys, scales, kv_cache, block_table, owner)


def _build(cls: Any, **values: Any) -> Any:
    """A released dataclass from the fields it has (0.33 and 0.34 differ in a few)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def chunk(step: Step, rows: list[int], token_start: int, max_seqlen_k: int | None = None) -> Any:
    """The chunk metadata of `rows` (step tokens, in the order the chunk scores them), starting at row
    `token_start` of the rows the chunks index."""
    backend = __import__(BACKEND, fromlist=["x"])
    reqs = sorted({step.owner[t][0] for t in rows})
    lens = [step.requests[b].seq_len for b in reqs]
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    local = {b: i for i, b in enumerate(reqs)}
    ks = torch.tensor([int(cu[local[step.owner[t][0]]]) for t in rows], dtype=torch.int32)
    ke = ks + torch.tensor([step.owner[t][1] + 1 for t in rows], dtype=torch.int32)
    return _build(
        backend.DeepseekV32IndexerPrefillChunkMetadata, block_table=step.block_table[reqs], cu_seqlen_ks=ks,
        cu_seqlen_ke=ke, cu_seq_lens=cu, token_to_seq=torch.tensor([local[step.owner[t][0]] for t in rows]),
        total_seq_lens=int(cu[-1]), max_seqlen_k=max_seqlen_k or int((ke - ks).max()), token_start=token_start,
        token_end=token_start + len(rows), num_reqs=len(reqs), local_cu_seq_lens=cu,
        local_total_seq_lens=int(cu[-1]), max_local_total_seq_lens=int(cu[-1]))


def metadata(step: Step, chunks: list[Any], **prefill: Any) -> Any:
    backend = __import__(BACKEND, fromlist=["x"])
    tokens = step.q.shape[0]
    return backend.DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor([r.seq_len for r in step.requests]), max_seq_len=max(r.seq_len for r in step.requests),
        slot_mapping=torch.zeros(tokens, dtype=torch.int64), num_decodes=0, num_decode_tokens=0,
        num_prefills=len(step.requests), num_prefill_tokens=tokens,
        prefill=_build(backend.DeepseekV32IndexerPrefillMetadata, chunks=chunks, **prefill))


def decode_metadata(step: Step, next_n: int, per_row: bool) -> Any:
    """A decode step of every request, `next_n` rows each (their last `next_n` tokens: query=next_n),
    seq_lens (B, next_n) per row or (B, 1)."""
    backend = __import__(BACKEND, fromlist=["x"])
    lengths = torch.tensor([r.seq_len for r in step.requests], dtype=torch.int32)
    offsets = torch.arange(next_n, dtype=torch.int32)
    seq_lens = (lengths[:, None] - next_n + 1 + offsets) if per_row else lengths[:, None]
    batch = len(step.requests)
    decode = _build(backend.DeepSeekV32IndexerDecodeMetadata, block_table=step.block_table, seq_lens=seq_lens,
                    decode_lens=torch.full((batch,), next_n, dtype=torch.int32), requires_padding=False,
                    schedule_metadata=torch.zeros(1, dtype=torch.int32))
    return backend.DeepseekV32IndexerMetadata(
        seq_lens=lengths, max_seq_len=int(lengths.max()), slot_mapping=torch.zeros(batch * next_n, dtype=torch.int64),
        num_decodes=batch, num_decode_tokens=batch * next_n, num_prefills=0, num_prefill_tokens=0, decode=decode)


def run(step: Step, meta: Any, layer: int = 0, **options: Any) -> torch.Tensor:
    """The released op on this step's rows, under a forward context holding `meta`; its top-k buffer."""
    indexer = __import__(INDEXER, fromlist=["x"])
    prefix = PREFIX.format(layer)
    tokens = step.q.shape[0]
    buffer = torch.full((tokens, TOP_K), -7, dtype=torch.int32)
    args = dict(hidden_states=torch.zeros(tokens, 8), k_cache_prefix=prefix, kv_cache=step.kv_cache,
                q_quant=step.q, q_scale=None, k=None, weights=step.weights, quant_block_size=128,
                scale_fmt=None, topk_tokens=TOP_K, head_dim=HEAD_DIM, max_model_len=4096,
                total_seq_lens=sum(r.seq_len for r in step.requests), topk_indices_buffer=buffer,
                skip_k_cache_insert=True, use_pcp=False, pcp_shard_decode_requests=False,
                dense_mha_metadata_layer_name="", **options)
    accepted = inspect.signature(indexer.sparse_attn_indexer).parameters
    with set_forward_context({prefix: meta}):
        indexer.sparse_attn_indexer(**{k: v for k, v in args.items() if k in accepted})
    return buffer


def expected(step: Step, token: int) -> torch.Tensor:
    """The logits row of a step token, recomputed from the step's inputs: its request's keys [0, p + 1)."""
    from tests.engine_fakes.vllm.edges import score

    b, p = step.owner[token]
    return score(step.q[token:token + 1], step.keys[b][:p + 1], step.scales[b][:p + 1],
                 step.weights[token:token + 1])[0]
