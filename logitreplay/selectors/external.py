"""The registry of upstream adapters beyond vLLM's (vllm.py): FlashInfer (flashinfer.py), SGLang and
sgl-kernel (sglang.py), cuDNN frontend's indexer top-k (cudnn.py), and DeepSeek's DeepSelect here. All
share one base (upstream.py); each maps our semantics (indices relative to the row start, int32, -1
tails, a possibly strided output view, bounds read on the device) onto the upstream call as production
makes it, or says in `supports` what it cannot do. Whether an upstream kernel really honours the
contract is not assumed: verification checks it.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import torch

from logitreplay.archive import ELEMENT_BYTES, Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.cudnn import CUDNN
from logitreplay.selectors.flashinfer import FLASHINFER
from logitreplay.selectors.sglang import SGLANG
from logitreplay.selectors.upstream import Upstream, import_package, starts_at_zero
from logitreplay.selectors.vllm_libs import Loaded

EXTERNAL: dict[str, str] = {
    "deepselect-upstream": "logitreplay.selectors.external:DeepSelectUpstream",
    **FLASHINFER,
    **SGLANG,
    **CUDNN,
}


class DeepSelectUpstream(Upstream):
    """DeepSeek's `deep_select.topk`: per-row `end` only, top_k <= 4096, input rows aligned as
    `get_stride_requirement()` says; indices are absolute columns, which equal ours when every row starts
    at 0, and `idx_oob_fill_value=-1` gives the -1 tails."""

    name = "deepselect-upstream"
    label = "deep_select"
    max_k = 4096

    def find(self) -> Loaded | str:
        found = import_package("deep_select", "deep_select (built from DeepSeek's DeepSelect repository)", self.path)
        if isinstance(found, str) or found.file is None:
            return found
        # The architecture probe reads the extension (deep_select_cuda*.so), not the package's __init__.
        lib = next(iter(sorted(glob.glob(os.path.join(os.path.dirname(found.file), "deep_select_cuda*.so")))), None)
        return Loaded(found.source, lib)

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
        align = int(ds.get_stride_requirement()[1]) // 4  # output row stride alignment, in int32s
        width = -(-top_k // align) * align
        scratch = torch.empty((logits.shape[0], width), dtype=torch.int32, device=logits.device)[:, :top_k]

        def launch() -> None:
            ds.topk(logits, top_k, sorted=False, end=row_ends, indices_type=torch.int32, sorted_index=False,
                    return_value=False, output_idx=scratch, idx_oob_fill_value=-1, abort_when_nan_found=False)
            out.copy_(scratch)

        return launch
