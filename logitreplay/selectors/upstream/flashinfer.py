"""FlashInfer's DSA top-k (`flashinfer/topk.py` of 0.7.2.post1, the same in 0.7.4), called as vLLM and
SGLang call it.

- `flashinfer`: vLLM 0.33's opt-in `flashinfer` decode backend (`indexer_topk.py` l.347):
  `top_k_ragged_transform(logits, offsets=0, row_ends, topk)`, float32, FlashInfer's own backend choice.
- `flashinfer-ragged[-cub]`: SGLang 0.5.23's `--dsa-topk-backend flashinfer` ragged (prefill) call
  (`dsa_topk_backend.py`): `top_k_ragged_transform(logits.contiguous(), offsets, lengths, k,
  deterministic=False, tie_break=0, dsa_graph_safe=True, row_starts=row_starts)`.
- `flashinfer-paged[-cub][-shuffled]`: its paged (decode) call, `top_k_page_table_transform(...,
  page_table_1, lengths, k, row_to_batch=None, ..., dsa_graph_safe=True, row_starts=None)`, on a page
  table of page size 1 built for the case (launches.py).
- `flashinfer-topk[-cub]`: SGLang's unfused path (`_topk_unfused` with `flashinfer.top_k(masked, k,
  sorted=False, deterministic=False, tie_break=0, dsa_graph_safe=True)`): mask the outside of each window
  to -inf, select, subtract the row start, -1 where the selected score is -inf.

The backend is forced per adapter through `FLASHINFER_TOPK_ALGO` (read by FlashInfer at each call;
a CUDA graph keeps what was captured): `default` is the radix FilteredTopK path (graph safe for k <=
2048, input rows contiguous: `CHECK_INPUT`), `cub` is CUB's DeviceBatchedTopK (rows up to 2^21 columns,
padded row strides accepted). FlashInfer allocates its outputs on every call (its API), and 0.7.4's radix
path its row-state scratch too while a graph is captured. `deterministic` (FlashInfer's deterministic
mode, radix only) is off here, as SGLang calls it; flashinfer074.py declares the calls with it on.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.upstream.base import Declared, Release, Upstream, fp32_only, starts_at_zero
from logitreplay.selectors.upstream.launches import paged, ragged, slots_fit
from logitreplay.selectors.upstream.loading import Source

# The top-k JIT module prebuilt for the GPU (AOT), where FlashInfer's loader looks first; else built there.
FLASHINFER = Source(("flashinfer",), "flashinfer-python", "flashinfer-python", "flashinfer",
                    binary="data/aot/topk/topk.so")
# Read from 0.7.2.post1; 0.7.4's topk.py has the same entry points, arguments and backend choice (radix,
# CUB, SM100 clusters), and differs in the radix path's row-state scratch only (under graph capture each
# call takes its own from the graph's pool), so these adapters take both.
FLASHINFER_072 = Release(FLASHINFER, "0.7.2.post1", ("0.7.2", "0.7.5"))

ALGO_ENV = "FLASHINFER_TOPK_ALGO"
ALGOS = {"radix": "default", "cub": "cub"}
FILTERED_TOPK_MAX_K = 2048  # topk.cuh; the graph-safe radix path takes no more
CUB_MAX_COLS = 1 << 21  # DeviceBatchedTopK's per-segment limit (can_use_cub_topk)
DTYPES = ("float32", "float16", "bfloat16")


@contextlib.contextmanager
def _algo(backend: str | None) -> Iterator[None]:
    """FLASHINFER_TOPK_ALGO set for one call (None: FlashInfer's own choice)."""
    if backend is None:
        yield
        return
    old = os.environ.get(ALGO_ENV)
    os.environ[ALGO_ENV] = ALGOS[backend]
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ALGO_ENV, None)
        else:
            os.environ[ALGO_ENV] = old


class FlashInfer(Upstream):
    """A FlashInfer top-k entry point; `backend` is "radix", "cub" or None (FlashInfer chooses);
    `deterministic` is the call's flag (FlashInfer's deterministic mode, which CUB does not serve)."""

    backend: str | None = "radix"
    deterministic = False

    def limits(self, case: Case, device: torch.device) -> str | None:
        if case.dtype not in DTYPES:
            return f"reads {', '.join(DTYPES)} logits, not {case.dtype}"
        if self.backend == "radix" and case.top_k > FILTERED_TOPK_MAX_K:
            return f"top_k {case.top_k}: the graph-safe radix path (FilteredTopK) takes k <= {FILTERED_TOPK_MAX_K}"
        if self.backend == "cub" and case.cols > CUB_MAX_COLS:
            return f"{case.cols} columns: CUB's DeviceBatchedTopK takes at most {CUB_MAX_COLS}"
        return None

    def kernel_name(self, case: Case) -> str:
        mode = ", deterministic" if self.deterministic else ""
        return f"flashinfer.{self.entry} ({self.backend or 'its own backend choice'}{mode})"

    entry = ""

    def _fi(self) -> Any:
        import flashinfer

        return flashinfer


class FlashInferVllm(FlashInfer):
    """vLLM 0.33's call: zero offsets, `row_ends` as lengths, the logits as vLLM holds them (a padded
    row stride is passed as it is, which FlashInfer's radix path rejects: declined here)."""

    declared = Declared("flashinfer", FLASHINFER_072, ("float32",), (1, None), ("decode",))
    entry = "top_k_ragged_transform"
    backend = None

    def limits(self, case: Case, device: torch.device) -> str | None:
        if case.row_stride != case.cols:
            return (f"row stride {case.row_stride} > {case.cols} columns: vLLM passes the padded logits as they "
                    "are and FlashInfer's radix path raises 'input must be contiguous'")
        return fp32_only(case) or starts_at_zero(case, "vLLM's flashinfer backend takes row ends only") or \
            super().limits(case, device)

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        fi = self._fi()
        offsets = torch.zeros_like(row_starts)

        def launch() -> None:
            out.copy_(fi.top_k_ragged_transform(logits, offsets, row_ends, top_k))

        return launch


class FlashInferRagged(FlashInfer):
    """SGLang's ragged call on offsets built for the case (shuffled row bases); output less offsets."""

    declared = Declared("flashinfer-ragged", FLASHINFER_072, DTYPES, (1, FILTERED_TOPK_MAX_K), ("decode", "starts", "padded"))
    entry = "top_k_ragged_transform"

    def limits(self, case: Case, device: torch.device) -> str | None:
        return slots_fit(case.rows, case.cols) or super().limits(case, device)

    def kernel_name(self, case: Case) -> str:
        return f"{super().kernel_name(case)}, SGLang's call on shuffled offsets, output less offsets"

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        fi, backend, deterministic = self._fi(), self.backend, self.deterministic

        def call(lengths: torch.Tensor, offsets: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            with _algo(backend):
                got: torch.Tensor = fi.top_k_ragged_transform(
                    logits.contiguous(), offsets, lengths, top_k, deterministic=deterministic, tie_break=0,
                    dsa_graph_safe=True, row_starts=row_starts)
            return got

        return ragged(logits, row_starts, row_ends, top_k, out, call)


class FlashInferRaggedCub(FlashInferRagged):
    declared = Declared("flashinfer-ragged-cub", FLASHINFER_072, DTYPES, (1, None), ("decode", "starts", "padded"))
    backend = "cub"


class FlashInferPaged(FlashInfer):
    """SGLang's decode call on a page_size-1 table built for the case; output mapped back through it."""

    declared = Declared("flashinfer-paged", FLASHINFER_072, DTYPES, (1, FILTERED_TOPK_MAX_K), ("decode", "padded"))
    entry = "top_k_page_table_transform"
    layout = "identity"

    def limits(self, case: Case, device: torch.device) -> str | None:
        return starts_at_zero(case, "SGLang's paged call is its decode form") or slots_fit(case.rows, case.cols) \
            or super().limits(case, device)

    def kernel_name(self, case: Case) -> str:
        return f"{super().kernel_name(case)}, SGLang's decode call on a {self.layout} page table, mapped back"

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        fi, backend, deterministic = self._fi(), self.backend, self.deterministic

        def call(table: torch.Tensor, _: torch.Tensor) -> torch.Tensor:
            with _algo(backend):
                slots: torch.Tensor = fi.top_k_page_table_transform(
                    logits.contiguous(), table, row_ends, top_k, row_to_batch=None, deterministic=deterministic,
                    tie_break=0, dsa_graph_safe=True, row_starts=None, page_table_row_starts=None)
            return slots

        return paged(logits, top_k, out, self.layout, 1, call)


class FlashInferPagedCub(FlashInferPaged):
    declared = Declared("flashinfer-paged-cub", FLASHINFER_072, DTYPES, (1, None), ("decode", "padded"))
    backend = "cub"


class FlashInferPagedShuffled(FlashInferPaged):
    declared = Declared("flashinfer-paged-shuffled", FLASHINFER_072, DTYPES, (1, FILTERED_TOPK_MAX_K), ("decode", "padded"))
    layout = "shuffled"


class FlashInferTopK(FlashInfer):
    """SGLang's unfused path with `flashinfer.top_k` (its `_topk_unfused`), all of it timed."""

    declared = Declared("flashinfer-topk", FLASHINFER_072, DTYPES, (1, FILTERED_TOPK_MAX_K), ("decode", "starts", "padded"))
    entry = "top_k"

    def kernel_name(self, case: Case) -> str:
        return f"{super().kernel_name(case)} inside SGLang's _topk_unfused (mask, select, subtract)"

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        fi, backend = self._fi(), self.backend
        cols = logits.shape[1]
        col = torch.arange(cols, dtype=torch.int32, device=logits.device)[None, :]
        valid_k = min(top_k, cols)

        def launch() -> None:
            valid = (col >= row_starts[:, None]) & (col < row_ends[:, None])
            masked = logits.masked_fill(~valid, float("-inf"))
            with _algo(backend):
                scores, idx = fi.top_k(masked, valid_k, sorted=False, deterministic=False,
                                       tie_break=0, dsa_graph_safe=True)
            local = (idx.to(torch.int32) - row_starts[:, None]).masked_fill(scores == float("-inf"), -1)
            out.fill_(-1)
            out[:, :valid_k].copy_(local)

        return launch


class FlashInferTopKCub(FlashInferTopK):
    declared = Declared("flashinfer-topk-cub", FLASHINFER_072, DTYPES, (1, None), ("decode", "starts", "padded"))
    backend = "cub"


__all__ = ["FLASHINFER", "FLASHINFER_072", "FlashInfer", "FlashInferPaged", "FlashInferRagged", "FlashInferTopK",
           "FlashInferVllm"]
