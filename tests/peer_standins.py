"""STAND-INS for the DSA top-k peers, which need CUDA: FlashInfer 0.7.2.post1 (`flashinfer/topk.py`),
SGLang 0.5.23's top-k v2 (`sglang/kernels/ops/attention/dsv4/topk.py`) and sgl-kernel 0.4.6's ops
(`torch.ops.sgl_kernel.*`, as `sgl_kernel/top_k.py` calls them). Each reproduces the real module path,
entry point names, signatures and semantics read from those packages (windows, offsets, page tables,
-1 padding, FlashInfer's contiguity check on its radix path and `FLASHINFER_TOPK_ALGO`, SGLang v2's
in-place masking of the <= 3 columns ahead of a window) on the CPU with torch.topk, and records each call
in `CALLS` so a test can assert the arguments production passes. `write(root)` lays them out as
importable packages under `root`."""

from __future__ import annotations

from pathlib import Path

_COMMON = '''
import os
import torch

CALLS = []


def select(scores, start, length, k):
    """Row-relative indices of the k largest of scores[start:start+length], -1 padded to k."""
    out = torch.full((k,), -1, dtype=torch.int32)
    n = min(k, int(length))
    if n:
        window = scores[int(start):int(start) + int(length)].float()
        out[:n] = torch.topk(window, n).indices.to(torch.int32)
    return out
'''

_FLASHINFER_TOPK = _COMMON + '''

def _radix_checks(input):
    if os.environ.get("FLASHINFER_TOPK_ALGO") != "cub" and not input.is_contiguous():
        raise ValueError("input must be contiguous")  # CHECK_INPUT in csrc/topk.cu


def top_k(input, k, sorted=False, deterministic=False, tie_break=0, dsa_graph_safe=False):
    CALLS.append(("top_k", dict(k=k, sorted=sorted, deterministic=deterministic, tie_break=tie_break,
                                dsa_graph_safe=dsa_graph_safe, algo=os.environ.get("FLASHINFER_TOPK_ALGO"))))
    _radix_checks(input)
    values, indices = torch.topk(input.float(), k, dim=-1)
    return values.to(input.dtype), indices.to(torch.int64)


def top_k_ragged_transform(input, offsets, lengths, k, deterministic=False, tie_break=0, dsa_graph_safe=False,
                           row_starts=None):
    CALLS.append(("top_k_ragged_transform", dict(k=k, dsa_graph_safe=dsa_graph_safe, row_starts=row_starts,
                                                 deterministic=deterministic,
                                                 algo=os.environ.get("FLASHINFER_TOPK_ALGO"))))
    _radix_checks(input)
    out = torch.full((input.shape[0], k), -1, dtype=torch.int32)
    for r in range(input.shape[0]):
        local = select(input[r], 0 if row_starts is None else row_starts[r], lengths[r], k)
        out[r] = torch.where(local < 0, -1, local + offsets[r])
    return out


def top_k_page_table_transform(input, src_page_table, lengths, k, row_to_batch=None, deterministic=False,
                               tie_break=0, dsa_graph_safe=False, row_starts=None, page_table_row_starts=None, *,
                               page_size=1, out=None, out_raw_indices=None):
    CALLS.append(("top_k_page_table_transform", dict(k=k, dsa_graph_safe=dsa_graph_safe, row_starts=row_starts,
                                                     deterministic=deterministic,
                                                     algo=os.environ.get("FLASHINFER_TOPK_ALGO"))))
    if not input.stride(-1) == 1:
        raise ValueError("input must be contiguous in its last dimension")
    out = torch.full((input.shape[0], k), -1, dtype=torch.int32) if out is None else out
    pt_starts = page_table_row_starts if page_table_row_starts is not None else row_starts
    for r in range(input.shape[0]):
        local = select(input[r], 0 if row_starts is None else row_starts[r], lengths[r], k)
        b = r if row_to_batch is None else int(row_to_batch[r])
        p = local + (0 if pt_starts is None else int(pt_starts[r]))
        phys = src_page_table[b, (p // page_size).clamp(min=0)] * page_size + p % page_size
        out[r] = torch.where(local < 0, -1, phys)
    return out
'''

_SGLANG_TOPK = _COMMON + '''

def plan_topk_v2(seq_lens, static_threshold=-1, *, out=None):
    CALLS.append(("plan_topk_v2", dict(seq_lens=seq_lens)))
    metadata = seq_lens.new_empty(seq_lens.shape[0] + 1, 2) if out is None else out
    metadata[0] = torch.tensor([-1, 0], dtype=torch.int32)  # no item routed to the cluster pool
    return metadata


def topk_transform_ragged_v2(scores, seq_lens, *, out_offsets, out_indices, row_starts=None):
    CALLS.append(("topk_transform_ragged_v2", dict(scores=scores, row_starts=row_starts)))
    assert scores.dtype == torch.float32 and scores.stride(1) == 1 and scores.stride(0) % 4 == 0
    k = out_indices.shape[1]
    for r in range(scores.shape[0]):
        ks = 0 if row_starts is None else int(row_starts[r])
        scores[r, ks & ~3:ks] = float("-inf")  # the columns the 16-byte-aligned read base pulls in
        local = select(scores[r], ks, seq_lens[r], k)
        out_indices[r] = torch.where(local < 0, -1, local + out_offsets[r])


def topk_transform_paged_v2(scores, seq_lens, page_tables, out_page_indices, page_size, metadata,
                            out_raw_indices=None):
    CALLS.append(("topk_transform_paged_v2", dict(page_size=page_size, metadata=metadata)))
    assert metadata.shape == (scores.shape[0] + 1, 2), "metadata must come from plan_topk_v2"
    k = out_page_indices.shape[1]
    for r in range(scores.shape[0]):
        local = select(scores[r], 0, seq_lens[r], k)
        phys = page_tables[r, (local // page_size).clamp(min=0)] * page_size + local % page_size
        out_page_indices[r] = torch.where(local < 0, -1, phys)
'''

_SGL_KERNEL = _COMMON + '''
__version__ = "{version}"

_lib = torch.library.Library("sgl_kernel", "FRAGMENT")
_lib.define("fast_topk(Tensor score, Tensor(a!) indices, Tensor lengths, Tensor? row_starts) -> ()")
_lib.define("fast_topk_transform_fused(Tensor score, Tensor lengths, Tensor(a!) dst_page_table, "
            "Tensor src_page_table, Tensor cu_seqlens_q, Tensor? row_starts) -> ()")
_lib.define("fast_topk_transform_ragged_fused(Tensor score, Tensor lengths, Tensor(a!) topk_indices_ragged, "
            "Tensor topk_indices_offset, Tensor? row_starts) -> ()")


def _local(score, lengths, row_starts, r, k):
    return select(score[r], 0 if row_starts is None else row_starts[r], lengths[r], k)


def fast_topk(score, indices, lengths, row_starts):
    CALLS.append(("fast_topk", dict(row_starts=row_starts)))
    for r in range(score.shape[0]):
        indices[r] = _local(score, lengths, row_starts, r, indices.shape[1])


def fast_topk_transform_fused(score, lengths, dst_page_table, src_page_table, cu_seqlens_q, row_starts):
    CALLS.append(("fast_topk_transform_fused", dict(cu_seqlens_q=cu_seqlens_q, row_starts=row_starts)))
    batch = torch.searchsorted(cu_seqlens_q, torch.arange(score.shape[0], dtype=torch.int32), right=True) - 1
    for r in range(score.shape[0]):
        local = _local(score, lengths, row_starts, r, dst_page_table.shape[1])
        dst_page_table[r] = torch.where(local < 0, -1, src_page_table[int(batch[r]), local.clamp(min=0)])


def fast_topk_transform_ragged_fused(score, lengths, topk_indices_ragged, topk_indices_offset, row_starts):
    CALLS.append(("fast_topk_transform_ragged_fused", dict(row_starts=row_starts)))
    for r in range(score.shape[0]):
        local = _local(score, lengths, row_starts, r, topk_indices_ragged.shape[1])
        topk_indices_ragged[r] = torch.where(local < 0, -1, local + topk_indices_offset[r])


for _name in ("fast_topk", "fast_topk_transform_fused", "fast_topk_transform_ragged_fused"):
    _lib.impl(_name, globals()[_name], "CPU")
ops = torch.ops.sgl_kernel
'''

# The release each stand-in reports (its `__version__`), by distribution: the adapters read from it run here.
VERSIONS = {"flashinfer-python": "0.7.2.post1", "sglang-kernel": "0.4.6"}
_SGLANG_PACKAGES = ("sglang", "sglang/kernels", "sglang/kernels/ops", "sglang/kernels/ops/attention",
                    "sglang/kernels/ops/attention/dsv4")


def write(root: Path, versions: dict[str, str] = VERSIONS) -> Path:
    """Lay out the stand-in `flashinfer`, `sglang` and `sgl_kernel` packages under `root`, reporting
    `versions` (by distribution)."""
    (root / "flashinfer").mkdir(parents=True)
    (root / "flashinfer" / "__init__.py").write_text(
        f'__version__ = "{versions["flashinfer-python"]}"\nfrom flashinfer.topk import top_k, '
        'top_k_page_table_transform, top_k_ragged_transform  # noqa: F401\n')
    (root / "flashinfer" / "topk.py").write_text(_FLASHINFER_TOPK)
    for pkg in _SGLANG_PACKAGES:
        (root / pkg).mkdir(parents=True, exist_ok=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "sglang" / "kernels" / "ops" / "attention" / "dsv4" / "topk.py").write_text(_SGLANG_TOPK)
    (root / "sgl_kernel").mkdir()
    (root / "sgl_kernel" / "__init__.py").write_text(_SGL_KERNEL.replace("{version}", versions["sglang-kernel"]))
    return root
