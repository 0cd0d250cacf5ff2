"""The bundled CUDA kernels as selectors: `native` (histogram radix-select), `deepselect` and `split`
(rows split over many blocks, for decode).

All implement the C interface of `topk_api.h`, bound once in abi.py, so one selector class serves all;
they differ only in the library they load. `prepare` does every check and allocation (workspace, status
header) up front; the launch it returns only passes raw pointers and the current stream to the library,
so it never allocates or syncs and can be captured in a CUDA graph, which stays valid when the bounds
change in place. The layout checks (`check_layout`) read only shapes, strides and dtypes, so they run
without a device (on CPU or meta tensors) as well.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from logitreplay.archive import Case
from logitreplay.errors import KernelError, SelectorError
from logitreplay.selectors import cpu_models
from logitreplay.selectors.cuda import abi, build

_DTYPE_CODE = {getattr(torch, name): code for name, code in abi.DTYPES.items()}


@dataclass
class KernelLaunch:
    """One prepared launch: calling it enqueues the kernel on the current stream."""

    kernel: str
    fn: Callable[..., int]
    args: tuple[object, ...]  # every argument of lr_<family>_topk but the stream
    device: torch.device
    workspace: torch.Tensor  # kept alive as long as the launch (and any graph holding it)
    keep: tuple[torch.Tensor, ...]  # tensors whose pointers `args` holds

    def __call__(self) -> None:
        stream = torch.cuda.current_stream(self.device).cuda_stream
        rc = self.fn(*self.args, ctypes.c_void_p(stream))
        if rc != abi.LR_OK:
            raise KernelError(f"kernel {self.kernel}: {abi.describe(rc)}")

    def nan_seen(self) -> bool:
        """Whether any launch so far met a NaN inside a row's bounds (synchronizes; not for timed code)."""
        return bool(int(self.workspace[:4].view(torch.int32).item()) & abi.LR_STATUS_NAN)

    def work(self, rows: int) -> np.ndarray:
        """The work record of a work build (`CudaKernel(work=True)`): per row, the counters of the family's
        CPU model work (cpu_models), summed over the launches so far; (rows, 4) int64 (synchronizes)."""
        record = self.workspace[self.workspace.numel() - rows * abi.WORK_BYTES:]
        return record.view(torch.int32).reshape(rows, abi.WORK_COUNTERS).cpu().numpy().astype(np.int64)


class CudaKernel:
    """A bundled kernel family bound through ctypes; subclasses name the family. `work=True` loads the
    work build (build.WORK_FLAGS), whose launches also keep the per-row work record; `deterministic=True`
    the deterministic build (build.DET_FLAGS: lowest indices among the ties, ascending index order)."""

    name: str

    def __init__(self, work: bool = False, deterministic: bool = False) -> None:
        self.extra = (build.WORK_FLAGS if work else ()) + (build.DET_FLAGS if deterministic else ())

    def _entry_points(self) -> dict[str, Callable[..., int]]:
        return abi.entry_points(self.name, None, self.extra)

    def check_layout(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, top_k: int,
                     out: torch.Tensor) -> None:
        """The layout lr_<family>_topk reads (see check_layout); a family adds its own limits."""
        check_layout(self.name, logits, row_starts, row_ends, top_k, out)

    def supports(self, case: Case, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "a CUDA kernel: needs a CUDA device"
        try:
            fns = self._entry_points()
        except SelectorError as e:
            return str(e)
        max_k = int(fns["max_top_k"](abi.DTYPES[case.dtype]))
        if case.top_k > max_k:
            return f"top_k {case.top_k} > {max_k}, the most this kernel selects"
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> KernelLaunch:
        if logits.device.type != "cuda":
            raise KernelError(f"kernel {self.name}: logits on {logits.device}, expected a CUDA device")
        self.check_layout(logits, row_starts, row_ends, top_k, out)
        fns = self._entry_points()
        rows, cols = logits.shape
        dtype = _DTYPE_CODE[logits.dtype]
        nbytes = int(fns["workspace_bytes"](rows, cols, top_k, dtype))
        # Zeroed here once, whole: the status header the kernels OR flags into, and any state a family
        # needs zeroed (split's counters, which every launch leaves zeroed again). The caching allocator
        # hands out 512-byte aligned blocks, which covers the 256 bytes topk_api.h asks for.
        workspace = torch.zeros(max(nbytes, abi.STATUS_BYTES), dtype=torch.uint8, device=logits.device)
        args = abi.typed("topk", logits.data_ptr(), dtype, logits.stride(0), row_starts.data_ptr(),
                         row_ends.data_ptr(), rows, top_k, out.data_ptr(), out.stride(0), workspace.data_ptr(),
                         workspace.numel())
        return KernelLaunch(self.name, fns["topk"], args, logits.device, workspace, (logits, row_starts, row_ends, out))


def check_layout(name: str, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, top_k: int,
                 out: torch.Tensor) -> None:
    """The layout lr_<family>_topk reads: unit column strides, int32 contiguous bounds, all on the logits'
    device. Only metadata is read: CPU and meta tensors are checked alike."""

    def bad(why: str) -> KernelError:
        return KernelError(f"kernel {name}: {why}")

    if logits.dtype not in _DTYPE_CODE:
        raise bad(f"logits dtype {logits.dtype}, expected float32 or bfloat16")
    if logits.dim() != 2 or (logits.shape[1] > 1 and logits.stride(1) != 1):
        raise bad(f"logits must be a 2-D view with unit column stride, got strides {tuple(logits.stride())}")
    rows = logits.shape[0]
    for label, t in (("row_starts", row_starts), ("row_ends", row_ends)):
        if t.dtype != torch.int32 or t.shape != (rows,) or not t.is_contiguous() or t.device != logits.device:
            raise bad(f"{label} must be contiguous int32 ({rows},) on {logits.device}")
    if out.dtype != torch.int32 or out.shape != (rows, top_k) or out.device != logits.device:
        raise bad(f"out must be int32 ({rows}, {top_k}) on {logits.device}, got {out.dtype} {tuple(out.shape)}")
    if top_k > 1 and out.stride(1) != 1:
        raise bad(f"out must have unit column stride, got strides {tuple(out.stride())}")


class NativeCuda(CudaKernel):
    """vLLM's prefill histogram radix-select, as our own kernel (`native.cu`)."""

    name = "native"


class DeepSelectCuda(CudaKernel):
    """DeepSeek's DeepSelect single-pass rising-threshold select, as our own kernel (`deepselect.cu`)."""

    name = "deepselect"


class SplitCuda(CudaKernel):
    """A radix select with rows split over many blocks (`split.cu`), the bundled decode path."""

    name = "split"

    def check_layout(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, top_k: int,
                     out: torch.Tensor) -> None:
        super().check_layout(logits, row_starts, row_ends, top_k, out)
        rows, cols = logits.shape
        parts = cpu_models.split_parts_bound(rows, cols, logits.element_size())
        if parts > cpu_models.SPLIT_PLAN_ITEMS:
            raise KernelError(f"kernel split: {rows} rows of up to {cols} columns may be cut into {parts} parts, "
                              f"more than the {cpu_models.SPLIT_PLAN_ITEMS} its plan indexes; launch fewer rows "
                              "at a time")
