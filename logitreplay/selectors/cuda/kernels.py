"""The bundled CUDA kernels as selectors: `native` (histogram radix-select) and `deepselect`.

Both speak the C ABI of `common.cuh`, so one binding serves both; they differ only in the library they
load. `prepare` does every check and allocation (workspace, status header) up front; the launch it
returns only passes raw pointers and the current stream to the library, so it never allocates or syncs
and can be captured in a CUDA graph, which stays valid when the bounds change in place.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass

import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import SelectorError
from logitreplay.selectors.cuda import build

_DTYPE_CODE = {torch.float32: 0, torch.bfloat16: 1}
_CASE_DTYPE_CODE = {"float32": 0, "bfloat16": 1}
_ERRORS = {1: "invalid argument", 2: "workspace too small", 3: "kernel launch failed"}
_STATUS_NAN = 1
# The ABI's status header: zeroed once here, flags OR-ed in by the kernels.
_WORKSPACE_ALIGN = 256


class KernelError(SelectorError):
    """A bundled kernel refused its arguments or failed to launch."""


@dataclass
class KernelLaunch:
    """One prepared launch: calling it enqueues the kernel on the current stream."""

    kernel: str
    fn: Callable[..., int]
    args: tuple[object, ...]  # every ABI argument but the stream
    device: torch.device
    workspace: torch.Tensor  # kept alive as long as the launch (and any graph holding it)
    keep: tuple[torch.Tensor, ...]  # tensors whose pointers `args` holds

    def __call__(self) -> None:
        stream = torch.cuda.current_stream(self.device).cuda_stream
        rc = self.fn(*self.args, ctypes.c_void_p(stream))
        if rc != 0:
            raise KernelError(f"kernel {self.kernel}: {_ERRORS.get(rc, f'error {rc}')}")

    def nan_seen(self) -> bool:
        """Whether any launch so far met a NaN inside a row's bounds (synchronizes; not for timed code)."""
        return bool(int(self.workspace[:4].view(torch.int32).item()) & _STATUS_NAN)


class CudaKernel:
    """A bundled kernel family bound through ctypes; subclasses name the family."""

    name: str

    def _lib(self) -> ctypes.CDLL:
        return build.load(self.name)

    def supports(self, case: Case, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "a CUDA kernel: needs a CUDA device"
        try:
            lib = self._lib()
        except SelectorError as e:
            return str(e)
        max_k = int(getattr(lib, f"lr_{self.name}_max_top_k")(_CASE_DTYPE_CODE[case.dtype]))
        if case.top_k > max_k:
            return f"top_k {case.top_k} > {max_k}, the most this kernel selects"
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> KernelLaunch:
        _check(self.name, logits, row_starts, row_ends, top_k, out)
        lib = self._lib()
        rows, cols = logits.shape
        dtype = _DTYPE_CODE[logits.dtype]
        nbytes = int(getattr(lib, f"lr_{self.name}_workspace_bytes")(rows, cols, top_k, dtype))
        # The caching allocator hands out 512-byte aligned blocks, which covers the ABI's 256.
        workspace = torch.zeros(max(nbytes, _WORKSPACE_ALIGN), dtype=torch.uint8, device=logits.device)
        args = (ctypes.c_void_p(logits.data_ptr()), ctypes.c_int(dtype), ctypes.c_longlong(logits.stride(0)),
                ctypes.c_void_p(row_starts.data_ptr()), ctypes.c_void_p(row_ends.data_ptr()),
                ctypes.c_int(rows), ctypes.c_int(top_k), ctypes.c_void_p(out.data_ptr()),
                ctypes.c_longlong(out.stride(0)), ctypes.c_void_p(workspace.data_ptr()),
                ctypes.c_longlong(workspace.numel()))
        return KernelLaunch(self.name, getattr(lib, f"lr_{self.name}_topk"), args, logits.device, workspace,
                            (logits, row_starts, row_ends, out))


def _check(name: str, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, top_k: int,
           out: torch.Tensor) -> None:
    """The layout the ABI reads: unit column strides, int32 contiguous bounds, all on one CUDA device."""

    def bad(why: str) -> KernelError:
        return KernelError(f"kernel {name}: {why}")

    if logits.device.type != "cuda":
        raise bad(f"logits on {logits.device}, expected a CUDA device")
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
