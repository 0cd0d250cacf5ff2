"""The built-in `native`, `deepselect` and `split` selectors and their deterministic modes (`native-det`, ...):
one name, the right implementation per device.

On CPU they run the algorithm models of `cpu_models.py` (so replay works on any machine and reports the
work each algorithm does); on CUDA they delegate to the bundled kernels of `selectors/cuda/`. The kernel
module is imported, and its kernels built, only when a CUDA device is first asked for, so that a machine
without nvcc or a GPU never pays for it; when that fails, `supports` says why instead of raising, and
the other selectors still run.

A `-det` name is the same algorithm in its deterministic mode (docs/selectors.md): among the candidates
tied at a row's k-th value the lowest indices are taken, so the index set equals a stable sort's, and
the output is in ascending index order, the same run after run. On CUDA that is the kernel's build with
`-DLR_DETERMINISTIC`; on CPU the model's selection put into that form (`cpu_models.lowest_index_first`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from logitreplay.archive import Case
from logitreplay.errors import one_line
from logitreplay.selectors import cpu_models
from logitreplay.selectors.base import Launch, Selector

Model = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], tuple[torch.Tensor, object]]


class Dispatched:
    """A selector whose implementation depends on the device: a CPU model or a CUDA kernel class."""

    def __init__(self, name: str, model: Model, cuda_class: str, deterministic: bool = False) -> None:
        self.name = name
        self._model = model
        self._cuda_class = cuda_class
        self._deterministic = deterministic
        self._cuda: Selector | None = None
        self._cuda_error: str | None = None

    def _kernel(self) -> Selector | None:
        if self._cuda is None and self._cuda_error is None:
            try:
                from logitreplay.selectors.cuda import kernels

                self._cuda = getattr(kernels, self._cuda_class)(deterministic=self._deterministic)
            except Exception as e:  # a missing nvcc, a failed build, an unsupported architecture, ...
                self._cuda_error = f"CUDA kernel unavailable ({type(e).__name__}: {one_line(e, None)})"
        return self._cuda

    def supports(self, case: Case, device: torch.device) -> str | None:
        if device.type == "cpu":
            return None
        if device.type == "cuda":
            kernel = self._kernel()
            return self._cuda_error if kernel is None else kernel.supports(case, device)
        return f"no {self.name} implementation for device type {device.type}"

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        if logits.device.type == "cuda":
            kernel = self._kernel()
            if kernel is None:
                raise RuntimeError(self._cuda_error)
            return kernel.prepare(logits, row_starts, row_ends, top_k, out)
        model, deterministic = self._model, self._deterministic

        def launch() -> None:
            indices, _ = model(logits, row_starts, row_ends, top_k)
            if deterministic:
                indices = cpu_models.lowest_index_first(logits, row_starts, row_ends, indices)
            out.copy_(indices)

        return launch


def native() -> Dispatched:
    """vLLM's prefill histogram radix-select: CPU model or bundled CUDA kernel."""
    return Dispatched("native", cpu_models.native_topk, "NativeCuda")


def split() -> Dispatched:
    """The split-row radix select, the bundled decode path: CPU model or bundled CUDA kernel."""
    return Dispatched("split", cpu_models.split_topk, "SplitCuda")


def deepselect() -> Dispatched:
    """DeepSelect's rising-threshold single pass: CPU model or bundled CUDA kernel."""
    return Dispatched("deepselect", cpu_models.deepselect_topk, "DeepSelectCuda")


def native_det() -> Dispatched:
    """`native` in its deterministic mode: lowest indices among the ties, ascending index order."""
    return Dispatched("native-det", cpu_models.native_topk, "NativeCuda", deterministic=True)


def split_det() -> Dispatched:
    """`split` in its deterministic mode: lowest indices among the ties, ascending index order."""
    return Dispatched("split-det", cpu_models.split_topk, "SplitCuda", deterministic=True)


def deepselect_det() -> Dispatched:
    """`deepselect` in its deterministic mode: lowest indices among the ties, ascending index order."""
    return Dispatched("deepselect-det", cpu_models.deepselect_topk, "DeepSelectCuda", deterministic=True)
