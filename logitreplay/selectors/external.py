"""Adapters to upstream top-k kernels, usable when their package imports (CUDA only); vLLM's own
kernels have theirs in vllm.py.

Each maps our semantics (indices relative to the row start, int32, -1 tails, a possibly strided output
view, bounds read on the device) onto the upstream call, or says in `supports` what it cannot do. The
upstream kernels write contiguous outputs, so each launch ends with one copy of `rows * top_k * 4` bytes
into the view: part of the timed launch, small against the selection itself (`staging_bytes`, `note`). Whether an upstream kernel
really honours the contract (-1 tails, relative indices) is not assumed here: verification checks it.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import torch

from logitreplay.archive import ELEMENT_BYTES, Case
from logitreplay.errors import one_line
from logitreplay.selectors.base import Launch

EXTERNAL: dict[str, str] = {
    "deepselect-upstream": "logitreplay.selectors.external:DeepSelectUpstream",
    "flashinfer": "logitreplay.selectors.external:FlashInferRagged",
    "sgl-fast-topk": "logitreplay.selectors.external:SglFastTopk",
}


class Upstream:
    """An upstream kernel behind an optional import: `module` is what must import, `package` what to
    install; subclasses add their own limits in `limits`."""

    name: str
    module: str
    package: str

    def _import(self) -> Any:
        return importlib.import_module(self.module)

    def supports(self, case: Case, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "an upstream CUDA kernel: needs a CUDA device"
        if importlib.util.find_spec(self.module.split(".")[0]) is None:
            return f"not installed (pip install {self.package})"
        try:
            self._import()
        except Exception as e:  # a broken install or an ABI mismatch with this torch
            return f"{self.module} does not import ({type(e).__name__}: {one_line(e, 160)})"
        return self.limits(case)

    def limits(self, case: Case) -> str | None:
        return None

    def staging_bytes(self, case: Case) -> int:
        """Bytes of the contiguous output the upstream call writes before the copy into the view."""
        return case.rows * case.top_k * 4

    def note(self, case: Case) -> str:
        return f"{self.module}; staging copy {self.staging_bytes(case)} B"


def _no_start(case: Case) -> str | None:
    if case.rows and bool((case.row_starts != 0).any()):
        return "takes a per-row length only: rows starting past column 0 (multi-request chunks) are not supported"
    return None


class DeepSelectUpstream(Upstream):
    """DeepSeek's `deep_select.topk`: per-row `end` only, top_k <= 4096, input rows aligned as
    `get_stride_requirement()` says; indices are absolute columns, which equal ours when every row starts
    at 0, and `idx_oob_fill_value=-1` gives the -1 tails."""

    name = "deepselect-upstream"
    module = "deep_select"
    package = "deep_select (from DeepSeek's DeepSelect repository)"
    max_k = 4096

    def limits(self, case: Case) -> str | None:
        if case.top_k > self.max_k:
            return f"top_k {case.top_k} > {self.max_k}"
        align = int(self._import().get_stride_requirement()[0])
        if (case.row_stride * ELEMENT_BYTES[case.dtype]) % align:
            return f"input row stride {case.row_stride} is not {align}-byte aligned (upstream requirement)"
        return _no_start(case)

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        ds = self._import()
        align = int(ds.get_stride_requirement()[1]) // 4  # output row stride alignment, in int32s
        width = -(-top_k // align) * align
        scratch = torch.empty((logits.shape[0], width), dtype=torch.int32, device=logits.device)[:, :top_k]

        def launch() -> None:
            ds.topk(logits, top_k, sorted=False, end=row_ends, indices_type=torch.int32, sorted_index=False,
                    return_value=False, output_idx=scratch, idx_oob_fill_value=-1, abort_when_nan_found=False)
            out.copy_(scratch)

        return launch


class FlashInferRagged(Upstream):
    """FlashInfer's `top_k_ragged_transform` with zero offsets, as vLLM 0.33's `flashinfer` decode
    backend calls it (indexer_topk.py l.347): the top_k of the first `lengths[r]` columns of each row,
    float32 only there. It allocates its output on every call (upstream API)."""

    name = "flashinfer"
    module = "flashinfer"
    package = "flashinfer-python"

    def limits(self, case: Case) -> str | None:
        if case.dtype != "float32":
            return f"vLLM's flashinfer backend reads float32 logits only, not {case.dtype}"
        return _no_start(case)

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        fi = self._import()
        lengths = torch.empty_like(row_ends)
        offsets = torch.zeros_like(row_starts)

        def launch() -> None:
            torch.sub(row_ends, row_starts, out=lengths)
            out.copy_(fi.top_k_ragged_transform(logits, offsets, lengths, top_k))

        return launch


class SglFastTopk(Upstream):
    """sgl-kernel's fast top-k (`fast_topk_v2`'s op): float32, exactly top_k = 2048 (DeepSeek V3.2),
    rows given as start and length; indices relative to the start, -1 tails."""

    name = "sgl-fast-topk"
    module = "sgl_kernel"
    package = "sgl-kernel"
    only_k = 2048

    def limits(self, case: Case) -> str | None:
        if case.top_k != self.only_k:
            return f"selects exactly top_k = {self.only_k}, not {case.top_k}"
        return None if case.dtype == "float32" else f"reads float32 logits only, not {case.dtype}"

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        self._import()
        op = torch.ops.sgl_kernel.fast_topk
        lengths = torch.empty_like(row_ends)
        scratch = torch.empty((logits.shape[0], top_k), dtype=torch.int32, device=logits.device)

        def launch() -> None:
            torch.sub(row_ends, row_starts, out=lengths)
            op(logits, scratch, lengths, row_starts)
            out.copy_(scratch)

        return launch
