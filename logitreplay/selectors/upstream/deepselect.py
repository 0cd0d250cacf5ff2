"""DeepSeek's DeepSelect (`deep_select`, built from its repository: no release on the package registry),
called through its Python API (`deep_select.topk`)."""

from __future__ import annotations

from typing import Any

import torch

from logitreplay.archive import ELEMENT_BYTES, Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.upstream.base import Declared, Release, Upstream, staged, starts_at_zero
from logitreplay.selectors.upstream.loading import Source

# The architecture probe reads the extension (deep_select_cuda*.so), not the package's __init__.
DEEP_SELECT = Source(("deep_select",), "deep_select (built from DeepSeek's DeepSelect repository)", "deep_select",
                     "deep_select", binary="deep_select_cuda*.so")
# Read from main at 382d62a, whose package says 1.0.0 (a build of the repository names no commit).
DEEP_SELECT_382D62A = Release(DEEP_SELECT, "1.0.0+382d62a", ("1.0.0", "1.1.0"))


class DeepSelectUpstream(Upstream):
    """DeepSeek's `deep_select.topk`: per-row `end` only, top_k <= 4096, input rows aligned as
    `get_stride_requirement()` says; indices are absolute columns, which equal ours when every row starts
    at 0, and `idx_oob_fill_value=-1` gives the -1 tails."""

    max_k = 4096
    declared = Declared("deepselect-upstream", DEEP_SELECT_382D62A, ("float32", "bfloat16"), (1, max_k),
                        ("decode", "padded"))

    def _import(self) -> Any:
        import deep_select

        return deep_select

    def limits(self, case: Case, device: torch.device) -> str | None:
        if case.top_k > self.max_k:
            return f"top_k {case.top_k} > {self.max_k}"
        align = int(self._import().get_stride_requirement()[0])
        if (case.row_stride * ELEMENT_BYTES[case.dtype]) % align:
            return f"input row stride {case.row_stride} is not {align}-byte aligned (upstream requirement)"
        return starts_at_zero(case, "takes a per-row end only")

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        ds = self._import()

        def kernel(idx: torch.Tensor) -> None:
            ds.topk(logits, top_k, sorted=False, end=row_ends, indices_type=torch.int32, sorted_index=False,
                    return_value=False, output_idx=idx, idx_oob_fill_value=-1, abort_when_nan_found=False)

        return staged(kernel, out, int(ds.get_stride_requirement()[1]) // 4)  # output rows' alignment, int32s


__all__ = ["DEEP_SELECT", "DeepSelectUpstream"]
