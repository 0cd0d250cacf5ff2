"""SGLang 0.5.23's DSA top-k kernels, called as `dsa_topk_backend.py` calls them.

SGLang's default ("v2", `sglang/kernels/ops/attention/dsv4/topk.py`, JIT-built with nvcc into a tvm-ffi
module on first use): fp32 scores with unit column stride and a row stride that is a multiple of 4,
0 < k <= 2048.
- `sglang-ragged-v2`: `topk_transform_ragged_v2(scores, lengths, out_offsets=offsets, out_indices=out,
  row_starts=row_starts)` (`_topk_transform_v2_ragged`, the extend path). It writes its input: the <= 3
  columns ahead of each row's window that its 16-byte-aligned read pulls in are masked in place
  (documented upstream; SGLang's score buffer has no other consumer). So it runs, as in SGLang, on a
  score buffer of its own: a copy of the logits made once in `prepare`, never the replay's inputs.
- `sglang-paged-v2[-shuffled]`: `plan_topk_v2(lengths, out=plan)` then `topk_transform_paged_v2(scores,
  lengths, page_table, out, page_size=64, plan)` (`_topk_transform_v2_paged`, the decode path; rows start
  at 0). SGLang refreshes the plan once per forward inside its CUDA graph; here it is part of each
  launch, so that a graph replayed after the lengths changed stays right (check 5).

sgl-kernel 0.4.6 (`torch.ops.sgl_kernel.*` from `sgl_kernel/sm90/common_ops.abi3.so`): fp32, k = 2048.
- `sgl-fast-topk`: `fast_topk_v2`'s op `fast_topk(score, indices, lengths, row_starts)` (SGLang's
  unfused `topk_func`; row_starts None when every row starts at 0, as in decode).
- `sgl-fast-topk-paged[-shuffled]`: `fast_topk_transform_fused(score, lengths, dst, page_table_size_1,
  cu_seqlens_q, row_starts=None)`, decode: one query row per request.
- `sgl-fast-topk-ragged`: `fast_topk_transform_ragged_fused(score, lengths, out, offsets, row_starts)`.
Its candidate buffer has a fixed capacity: see bench/PEERS.md for what that does to some rows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.upstream.base import Declared, Release, Upstream, fp32_only, staged, starts_at_zero
from logitreplay.selectors.upstream.launches import paged, ragged, slots_fit
from logitreplay.selectors.upstream.loading import Source

V2_MODULE = "sglang.kernels.ops.attention.dsv4.topk"
V2_MAX_K = 2048
V2_PAGE_SIZE = 64  # the pool page size SGLang's real_page_table uses for DSA models
SGL_K = 2048  # fast_topk_v2 and the fused transforms assert topk == 2048

# SGLang's v2 wrappers, JIT-built for the GPU they run on.
SGLANG_V2 = Release(Source((V2_MODULE,), "sglang", "sglang", "sglang top-k v2 (JIT)", binary=None), "0.5.23",
                    ("0.5.23", "0.5.24"))
# sgl-kernel: `import sgl_kernel`, or a folder holding the package, or the library file itself
# (`common_ops.abi3.so`, beside the package in the staged layout). Read from 0.4.6, the newest release
# built for torch 2.11 (the GPU host's); checked against 0.4.6.post1 to 0.4.10 (the newest): their
# sm90/common_ops.abi3.so registers the three schemas unchanged and `sgl_kernel/top_k.py` calls them
# with the same k == 2048 assertions and outputs. Those are built for torch 2.13.0 (0.4.6.post1 to 0.4.8)
# and 2.14.1 (0.4.9, 0.4.10), whose symbols torch 2.11 lacks: there they do not import, and say why.
SGL_KERNEL = Release(Source(("sgl_kernel",), "sglang-kernel==0.4.6", "sglang-kernel", "sgl_kernel common_ops",
                            "sgl_kernel", "fast_topk", "common_ops.abi3.so"), "0.4.6", ("0.4.6", "0.4.11"))
V2_LAYOUTS = ("decode", "starts", "padded")  # padded: a row stride that is a multiple of 4


def _starts(row_starts: torch.Tensor) -> torch.Tensor | None:
    """The row starts as SGLang passes them: None when every row starts at 0 (decode)."""
    return row_starts if bool((row_starts != 0).any()) else None


def _own_scores(logits: torch.Tensor) -> torch.Tensor:
    """A copy of the logits with the same row stride: a score buffer the kernel may write."""
    rows, cols = logits.shape
    buf = torch.empty((rows, max(logits.stride(0), cols)), dtype=logits.dtype, device=logits.device)[:, :cols]
    return buf.copy_(logits)


class SglangV2(Upstream):
    def limits(self, case: Case, device: torch.device) -> str | None:
        if not 0 < case.top_k <= V2_MAX_K:
            return f"top_k {case.top_k}: the v2 kernel takes 0 < k <= {V2_MAX_K}"
        if case.row_stride % 4:
            return f"row stride {case.row_stride} is not a multiple of 4 (the v2 kernel's 16-byte rows)"
        return fp32_only(case) or slots_fit(case.rows, case.cols)

    def _v2(self) -> Any:
        import importlib

        return importlib.import_module(V2_MODULE)


class SglangRaggedV2(SglangV2):
    declared = Declared("sglang-ragged-v2", SGLANG_V2, ("float32",), (1, V2_MAX_K), V2_LAYOUTS)

    def kernel_name(self, case: Case) -> str:
        return ("topk_transform_ragged_v2 on shuffled offsets, output less offsets; writes <= 3 score columns "
                "ahead of each window (upstream's in-place masking), so it runs on its own copy of the logits")

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        v2 = self._v2()
        scores = _own_scores(logits)

        def call(lengths: torch.Tensor, offsets: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
            v2.topk_transform_ragged_v2(scores, lengths, out_offsets=offsets, out_indices=got, row_starts=row_starts)
            return got

        return ragged(logits, row_starts, row_ends, top_k, out, call)


class SglangPagedV2(SglangV2):
    declared = Declared("sglang-paged-v2", SGLANG_V2, ("float32",), (1, V2_MAX_K), ("decode", "padded"))
    layout = "identity"

    def limits(self, case: Case, device: torch.device) -> str | None:
        return starts_at_zero(case, "the paged v2 call is SGLang's decode form (lengths only)") or \
            super().limits(case, device)

    def kernel_name(self, case: Case) -> str:
        return (f"plan_topk_v2 + topk_transform_paged_v2 on a {self.layout} page table (page size "
                f"{V2_PAGE_SIZE}), mapped back")

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        v2 = self._v2()
        plan = torch.empty((logits.shape[0] + 1, 2), dtype=torch.int32, device=logits.device)

        def call(table: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
            v2.plan_topk_v2(row_ends, out=plan)
            v2.topk_transform_paged_v2(logits, row_ends, table, slots, V2_PAGE_SIZE, plan)
            return slots

        return paged(logits, top_k, out, self.layout, V2_PAGE_SIZE, call)


class SglangPagedV2Shuffled(SglangPagedV2):
    declared = Declared("sglang-paged-v2-shuffled", SGLANG_V2, ("float32",), (1, V2_MAX_K), ("decode", "padded"))
    layout = "shuffled"


class SglKernel(Upstream):
    """An op of sgl-kernel's library: `import sgl_kernel`, or `NAME@PATH` with the library file
    (`common_ops.abi3.so`) or a folder holding an `sgl_kernel` package."""

    op = ""

    def limits(self, case: Case, device: torch.device) -> str | None:
        if case.top_k != SGL_K:
            return f"selects exactly top_k = {SGL_K}, not {case.top_k}"
        return fp32_only(case)

    def kernel_name(self, case: Case) -> str:
        return f"torch.ops.sgl_kernel.{self.op}"

    def _op(self) -> Callable[..., None]:
        return getattr(torch.ops.sgl_kernel, self.op)


class SglFastTopk(SglKernel):
    declared = Declared("sgl-fast-topk", SGL_KERNEL, ("float32",), (SGL_K, SGL_K), ("decode", "starts", "padded"))
    op = "fast_topk"

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        op, starts = self._op(), _starts(row_starts)
        lengths = torch.empty_like(row_ends)

        def kernel(got: torch.Tensor) -> None:
            torch.sub(row_ends, row_starts, out=lengths)
            op(logits, got, lengths, starts)

        return staged(kernel, out)


class SglFastTopkPaged(SglKernel):
    declared = Declared("sgl-fast-topk-paged", SGL_KERNEL, ("float32",), (SGL_K, SGL_K), ("decode", "padded"))
    op = "fast_topk_transform_fused"
    layout = "identity"

    def limits(self, case: Case, device: torch.device) -> str | None:
        return starts_at_zero(case, "the paged call is SGLang's decode form") or slots_fit(case.rows, case.cols) \
            or super().limits(case, device)

    def kernel_name(self, case: Case) -> str:
        return f"{super().kernel_name(case)} on a {self.layout} page_table_size_1, mapped back"

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        op, rows = self._op(), logits.shape[0]
        cu_seqlens_q = torch.arange(rows + 1, dtype=torch.int32, device=logits.device)

        def call(table: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
            op(logits, row_ends, slots, table, cu_seqlens_q, None)
            return slots

        return paged(logits, top_k, out, self.layout, 1, call)


class SglFastTopkPagedShuffled(SglFastTopkPaged):
    declared = Declared("sgl-fast-topk-paged-shuffled", SGL_KERNEL, ("float32",), (SGL_K, SGL_K),
                        ("decode", "padded"))
    layout = "shuffled"


class SglFastTopkRagged(SglKernel):
    declared = Declared("sgl-fast-topk-ragged", SGL_KERNEL, ("float32",), (SGL_K, SGL_K), ("decode", "starts", "padded"))
    op = "fast_topk_transform_ragged_fused"

    def limits(self, case: Case, device: torch.device) -> str | None:
        return slots_fit(case.rows, case.cols) or super().limits(case, device)

    def kernel_name(self, case: Case) -> str:
        return f"{super().kernel_name(case)} on shuffled offsets, output less offsets"

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        op = self._op()

        def call(lengths: torch.Tensor, offsets: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
            op(logits, lengths, got, offsets, row_starts)
            return got

        return ragged(logits, row_starts, row_ends, top_k, out, call)


__all__ = ["SGLANG_V2", "SGL_KERNEL", "SglFastTopk", "SglFastTopkPaged", "SglFastTopkRagged", "SglKernel",
           "SglangPagedV2", "SglangRaggedV2"]
