"""The indexer's logits kernels on CPU: DeepGEMM's `fp8_mqa_logits` (prefill, contiguous keys) and
`fp8_paged_mqa_logits` (decode, keys through the page table), served as the `deep_gemm` module and
through the resolvers of `sglang.srt.layers.attention.dsa.utils` that SGLang's indexer calls.

What the kernels compute (DeepGEMM's contract): for query row i and key t,
`logit = sum over heads h of weights[i, h] * relu(q[i, h] . k[t]) * k_scale[t]`, with q and k in fp8 (e4m3)
and one fp32 scale per key. With `clean_logits=False`, as SGLang calls them, only the row's own keys are
written; the rest of the row is left as it was: here NaN, so that a capture keeping anything outside the
row's window shows. The paged kernel's rows are padded to a multiple of 256 columns (a strided view), as
DeepGEMM's are.

The paged index-K cache (SGLang's DSA pool, DeepGEMM's layout): a page of `block` tokens holds
`block * 128` fp8 bytes of keys, then `block` fp32 scales; the indexer views it as (pages, block, 1, 132).
"""

from __future__ import annotations

from typing import Any

import torch

from tests.engine_fakes.sglang.outside import outside_names

HEAD_DIM = 128
ROW_ALIGN = 256


def split_page(pages: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(pages, block * 132) bytes -> keys (pages, block, 128) fp32 (dequantized fp8) and scales (pages, block)."""
    flat = pages.reshape(pages.shape[0], -1)
    keys = flat[:, : block * HEAD_DIM].contiguous().view(torch.float8_e4m3fn).float()
    scales = flat[:, block * HEAD_DIM:].contiguous().view(torch.float32)
    return keys.view(-1, block, HEAD_DIM), scales


def _scores(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """(rows, H, D) fp8 queries against (keys, D) fp32 keys: (rows, keys) fp32."""
    per_head = torch.relu(torch.einsum("rhd,kd->rhk", q.float(), keys))
    return torch.einsum("rhk,rh->rk", per_head, weights.float()) * scales[None, :]


def fp8_mqa_logits(q: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
                   ks: torch.Tensor, ke: torch.Tensor, clean_logits: bool = False) -> torch.Tensor:
    keys, scales = kv
    rows, width = q.shape[0], keys.shape[0]
    out = torch.full((rows, (width + 3) // 4 * 4), float("nan"), dtype=torch.float32)[:, :width]
    scores = _scores(torch.Tensor(q), keys.float().view(width, -1), torch.Tensor(weights), scales.float().view(-1))
    cols = torch.arange(width)
    inside = (cols[None, :] >= ks[:, None].long()) & (cols[None, :] < ke[:, None].long())
    out[inside] = scores[inside]
    if clean_logits:
        out[~inside] = float("-inf")
    return out


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor, schedule: Any,
                         max_len: int, clean_logits: bool = False) -> torch.Tensor:
    batch, next_n = q.shape[:2]
    block = kv_cache.shape[1]
    keys, scales = split_page(kv_cache.view(kv_cache.shape[0], -1), block)
    rows = batch * next_n
    out = torch.full((rows, (max_len + ROW_ALIGN - 1) // ROW_ALIGN * ROW_ALIGN), float("nan"))[:, :max_len]
    lens = context_lens.reshape(batch, -1).long()
    for b in range(batch):
        for j in range(next_n):
            n = int(lens[b, j] if lens.shape[1] == next_n else lens[b, 0] - next_n + 1 + j)
            pages = block_table[b, : -(-n // block)].long()
            row_keys = keys[pages].reshape(-1, HEAD_DIM)[:n]
            row_scales = scales[pages].reshape(-1)[:n]
            r = b * next_n + j
            out[r, :n] = _scores(q[b, j][None], row_keys, weights[r][None], row_scales)[0]
            if clean_logits:
                out[r, n:] = float("-inf")
    return out


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block: int, sm_count: int) -> torch.Tensor:
    """DeepGEMM's schedule for the paged kernel; the CPU kernel needs none."""
    return torch.zeros(sm_count + 1, 2, dtype=torch.int32)


# `sglang.srt.layers.attention.dsa.utils`: which kernels the indexer runs, and the platform gates
def resolve_fp8_mqa_logits_fn() -> Any:
    return fp8_mqa_logits


def resolve_fp8_paged_mqa_logits_fn() -> Any:
    return fp8_paged_mqa_logits


def resolve_paged_mqa_logits_metadata_fn() -> Any:
    return get_paged_mqa_logits_metadata


def resolve_num_sms() -> int:
    return 8


def _no(*args: Any, **kwargs: Any) -> bool:
    return False


aiter_can_use_preshuffle_paged_mqa = gfx950_fused_indexer_runtime_ok = gfx950_model_shape_supported = _no
is_dsa_enable_prefill_cp = is_graph_dsa_split_op_surface = hadamard_preserved = _no

__getattr__ = outside_names(__name__)
