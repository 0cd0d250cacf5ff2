"""DeepSeek V4.1's sparse-logits path at its kernel boundary, as CPU fakes written from the facts of the
released names, signatures and semantics (`attention_config.indexer_sparse_logits`: the candidate consumers'
`SparseMQAIndexer`, vLLM 0.33 and 0.34).

- The Triton kernels of `kernels/attention/dsa/sparse_mqa_logits.py`, found by name: the fake
  `vllm.triton_utils`' `triton.jit` returns a launcher whose `[grid](...)` runs the kernel's CPU model.
  `_expand_candidates_kernel`: a row's candidate blocks (units of `candidate_block_size`) as ascending
  sparse block ids (units of `sparse_block_kv` tokens, `ratio` of them per candidate block) inside the
  row's keys, anchored at `ks // sbk`, padded by repeating the last; `end` counts the valid token columns.
  `_sparse_topk_remap_kernel`: a selected column `j * sbk + o` back to the request-local position
  `(sparse_indices[row, j] - ks // sbk) * sbk + o`, -1 outside `[0, width)`.
- DeepGEMM's sparse MQA logits (prefill and paged decode): bf16 `[rows, blocks * sbk]`, column `j * sbk + o`
  scoring workspace key `sparse_indices[row, j] * sbk + ks % sbk + o` (paged: context position
  `sparse_indices[row, j] * sbk + o` through the row's page table). Only the valid columns are scored, the
  rest hold garbage. The fake schedule is a tensor of each row's `ks`, `ke`, sparse block ids (and page
  table, paged).
- The K-cache gather of both indexer caches, the platform (CUDA, the 10.x family: the released layer builds
  only there), the config's indexer cache dtype, the FP8 path's unit Q scales.

The caches are this fake's own layouts. MXFP4: `[pages, page, D/2 + D/32]` bytes per key: e2m1 codes two
to a byte (element 2i in the low nibble), then one UE8M0 scale byte per 32 elements. FP8 (the fake
platform's fp8 is float32): `[pages, page, D + 1]`, the values and the power-of-two exponent of the key's
scale. Scales reach the kernels as int32 words of four UE8M0 bytes, one per 32 elements (D = 128).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from tests.engine_fakes.vllm.edges import GARBAGE, CudaPlatform, Edges, _module, fakes, kernel, score
from tests.engine_fakes.vllm.loader import InertModule, inert

D, GRANULE = 128, 32  # head dim; elements per UE8M0 scale (MXFP4's block): four scale bytes per key
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # the magnitudes of the 3 low code bits


def pack_mxfp4(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., D) fp32 values on the MXFP4 grid -> codes (..., D/2) uint8 and scale bytes (..., D/32) uint8.
    A granule's scale is 2^(floor(log2 amax) - 2): its largest magnitude codes as 4 or 6."""
    granules = x.reshape(*x.shape[:-1], -1, GRANULE)
    amax = granules.abs().amax(-1)
    exponent = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp(min=1e-30))) - 2, torch.zeros_like(amax))
    scaled = (granules / torch.exp2(exponent)[..., None]).reshape(x.shape)
    magnitude = (scaled.abs()[..., None] == E2M1).to(torch.int64).argmax(-1)
    assert torch.equal(E2M1[magnitude], scaled.abs()), "a value MXFP4 does not represent"
    codes = (magnitude + 8 * (scaled < 0).to(torch.int64)).to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), (exponent + 127).to(torch.uint8)


def dequantize(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Packed MXFP4 bytes (..., D/2) (int8 or uint8), or float values (..., D), times their UE8M0 scales
    (int32 words (...)) -> fp32 (..., D)."""
    if values.dtype in (torch.int8, torch.uint8):
        raw = values.view(torch.uint8).to(torch.int64)
        codes = torch.stack([raw & 15, raw >> 4], -1).reshape(*raw.shape[:-1], -1)
        x = E2M1[codes & 7] * (1 - 2 * (codes >> 3)).float()
    else:
        x = values.float()
    exponents = scales.contiguous().view(torch.uint8).reshape(*scales.shape, -1).float() - 127
    return (x.reshape(*x.shape[:-1], -1, GRANULE) * torch.exp2(exponents)[..., None]).reshape(x.shape)


def _expand(cand: torch.Tensor, _cs: int, ks: torch.Tensor, _kss: int, ke: torch.Tensor, _kes: int,
            out: torch.Tensor, _os: int, end: torch.Tensor, _es: int, *, K: int, S: int, RATIO: int, SBK: int,
            **_: Any) -> None:
    """`_expand_candidates_kernel` (one row per program)."""
    for r in range(cand.shape[0]):
        keys = max(int(ke[r]) - int(ks[r]), 0)
        inside = -(-keys // SBK)  # sparse blocks holding the row's keys
        mine = sorted(RATIO * c + half for c in cand[r, :K].tolist() if c >= 0 for half in range(RATIO)
                      if RATIO * c + half < inside)
        base = int(ks[r]) // SBK
        ids = [base + block for block in mine] or [base]
        out[r, :S] = torch.tensor(ids + [ids[-1]] * (S - len(ids)), dtype=torch.int32)
        end[r] = (len(mine) - 1) * SBK + min(SBK, keys - mine[-1] * SBK) if mine else 0


def _remap(cols: torch.Tensor, _cs: int, ids: torch.Tensor, _is: int, ks: torch.Tensor, _kss: int,
           out: torch.Tensor, _os: int, k: int, width: int, *, SBK: int, **_: Any) -> None:
    """`_sparse_topk_remap_kernel` (one row per program)."""
    for r in range(out.shape[0]):
        base = int(ks[r]) // SBK
        for i in range(int(k)):
            c = int(cols[r, i])
            out[r, i] = (int(ids[r, c // SBK]) - base) * SBK + c % SBK if 0 <= c < int(width) else -1


TRITON_MODELS: dict[str, Callable[..., None]] = {"_expand_candidates_kernel": _expand,
                                                  "_sparse_topk_remap_kernel": _remap}


class _Launcher:
    """A `@triton.jit` function: `launcher[grid](*args, **constexprs)` runs its CPU model."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.name = fn.__name__

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        model = TRITON_MODELS.get(self.name)
        if model is None:
            raise NotImplementedError(f"no CPU model of the Triton kernel {self.name}")
        return kernel(model)


def _jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    return _Launcher(fn) if fn is not None else _Launcher


def triton_utils(name: str) -> types.ModuleType:
    language = InertModule("triton.language")
    language.__dict__["constexpr"] = lambda value=None: value
    triton = InertModule("triton")
    triton.__dict__.update(jit=_jit, next_power_of_2=lambda n: 1 << max(int(n) - 1, 0).bit_length(),
                           cdiv=lambda a, b: -(-a // b))
    return _module(name, {"tl": language, "triton": triton, "HAS_TRITON": True}, inert=True)


def _tokens(row: torch.Tensor, blocks: int, sbk: int, ks: int, ke: int) -> list[int]:
    """The keys a row's valid columns score, in column order: its distinct leading blocks (the padding
    repeats the last) cut at `ke`."""
    ids = row[:blocks].tolist()
    distinct = [b for j, b in enumerate(ids) if j == 0 or b != ids[j - 1]]
    return [t for b in distinct for t in range(b * sbk + ks % sbk, (b + 1) * sbk + ks % sbk) if t < ke]


def _score_rows(queries: torch.Tensor, weights: torch.Tensor, width: int, keys_of: Callable[[int], torch.Tensor],
                ) -> torch.Tensor:
    out = torch.full((queries.shape[0], width), GARBAGE, dtype=torch.bfloat16)
    for r in range(queries.shape[0]):
        keys = keys_of(r)
        if keys.shape[0]:
            out[r, :keys.shape[0]] = score(queries[r:r + 1], keys, torch.ones(keys.shape[0]),
                                           weights[r:r + 1])[0].to(torch.bfloat16)
    return out


def sparse_schedule(ks: torch.Tensor, ke: torch.Tensor, num_kv: int, ids: torch.Tensor, qk_dtype: torch.dtype,
                    sbk: int) -> torch.Tensor:
    """`get_sparse_mqa_logits_metadata`."""
    return torch.cat([ks[:, None], ke[:, None], ids], 1)


@kernel
def sparse_logits(q: tuple[torch.Tensor, torch.Tensor], kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                  schedule: torch.Tensor, blocks: int, sbk: int) -> torch.Tensor:
    """`fp8_fp4_sparse_mqa_logits`: the packed workspace's keys."""
    keys = dequantize(*kv)

    def keys_of(r: int) -> torch.Tensor:
        return keys[_tokens(schedule[r, 2:], blocks, sbk, int(schedule[r, 0]), int(schedule[r, 1]))]

    return _score_rows(dequantize(*q), weights, blocks * sbk, keys_of)


def paged_sparse_schedule(context_lens: torch.Tensor, block_table: torch.Tensor, row_indices: torch.Tensor,
                          page: int, ids: torch.Tensor, qk_dtype: torch.dtype, sbk: int) -> torch.Tensor:
    """`get_paged_sparse_mqa_logits_metadata`."""
    return torch.cat([torch.zeros_like(context_lens)[:, None], context_lens[:, None], ids, block_table], 1)


@kernel
def paged_sparse_logits(q: tuple[torch.Tensor, torch.Tensor], kv_cache: torch.Tensor, weights: torch.Tensor,
                        schedule: torch.Tensor, blocks: int, sbk: int) -> torch.Tensor:
    """`fp8_fp4_paged_sparse_mqa_logits`: MXFP4 keys of the paged cache (the 4-D view), one query per row."""
    page = kv_cache.shape[1]

    def keys_of(r: int) -> torch.Tensor:
        table = schedule[r, 2 + blocks:]
        slots = [kv_cache[int(table[t // page]), t % page, 0]
                 for t in _tokens(schedule[r, 2:], blocks, sbk, 0, int(schedule[r, 1]))]
        if not slots:
            return torch.empty(0, D)
        raw = torch.stack(slots)
        return dequantize(raw[:, :D // 2], raw[:, D // 2:].contiguous().view(torch.int32).squeeze(-1))

    return _score_rows(dequantize(q[0][:, 0], q[1][:, 0]), weights, blocks * sbk, keys_of)


@kernel
def gather_keys(kv_cache: torch.Tensor, k_quant: torch.Tensor, k_scale: torch.Tensor, block_table: torch.Tensor,
                cu_seq_lens: torch.Tensor) -> None:
    """`cp_gather_indexer_k_quant_cache` for both caches: request b's keys into workspace rows
    [cu_seq_lens[b], cu_seq_lens[b + 1]): MXFP4 bytes as they are; FP8 values and four equal UE8M0 bytes."""
    page = kv_cache.shape[1]
    for b in range(block_table.shape[0]):
        start = int(cu_seq_lens[b])
        for t in range(int(cu_seq_lens[b + 1]) - start):
            slot = kv_cache[int(block_table[b, t // page]), t % page]
            if k_quant.dtype == torch.uint8:
                k_quant[start + t] = slot[:k_quant.shape[1]]
                k_scale[start + t] = slot[k_quant.shape[1]:]
            else:
                k_quant[start + t] = slot[:-1]
                k_scale[start + t] = int(slot[-1]) + 127


def unit_q_scales(q: torch.Tensor, q_scale: Any, weights: torch.Tensor, dtype: torch.dtype | None = None,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """`mqa_logits_mx_inputs` for FP8 Q without scales: unit UE8M0 scales (every byte 127), the weights
    in `dtype`."""
    unit = torch.full((*q.shape[:2], q.shape[-1] // GRANULE), 127, dtype=torch.uint8)
    return unit.view(torch.int32).squeeze(-1), weights.to(dtype or weights.dtype)


def sparse_fakes(edges: Edges, kv_dtype: str) -> dict[str, Callable[[str], types.ModuleType]]:
    """`edges.fakes` with the sparse path's edges, the indexer cache `kv_dtype` ("mxfp4" or "fp8")."""
    base = fakes(edges)

    def extended(name: str, names: dict[str, Any]) -> Callable[[str], types.ModuleType]:
        def build(module_name: str) -> types.ModuleType:
            module = base[name](module_name)
            module.__dict__.update(names)
            return module

        return build

    config = inert("VllmConfig")()
    config.attention_config = types.SimpleNamespace(resolve_indexer_kv_dtype=lambda default: kv_dtype)
    return {
        **base,
        "vllm.triton_utils": triton_utils,
        "vllm.platforms": lambda n: _module(n, {"current_platform": CudaPlatform(100)}, inert=True),
        "vllm.config": extended("vllm.config", {"get_current_vllm_config": lambda: config}),
        "vllm._custom_ops": extended("vllm._custom_ops", {"cp_gather_indexer_k_quant_cache": gather_keys}),
        "vllm.utils.deep_gemm": extended("vllm.utils.deep_gemm", {
            "has_deep_gemm_sparse_mqa": lambda: True, "mqa_logits_mx_inputs": unit_q_scales,
            "get_sparse_mqa_logits_metadata": sparse_schedule, "fp8_fp4_sparse_mqa_logits": sparse_logits,
            "get_paged_sparse_mqa_logits_metadata": paged_sparse_schedule,
            "fp8_fp4_paged_sparse_mqa_logits": paged_sparse_logits}),
    }
