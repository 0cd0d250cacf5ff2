"""The platform probes and helpers SGLang's modules import from `sglang.srt.utils` (and `.common`,
`.custom_op`, `compilation.compilation_config`, and the fp8 probes of `kernels.ops.quantization.fp8_kernel`): a CPU host, neither CUDA, ROCm, NPU nor XPU, so the
indexer takes its generic paths; op registration is a no-op (nothing is compiled here)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from tests.engine_fakes.sglang.outside import outside_names


def _no(*args: Any, **kwargs: Any) -> bool:
    return False


is_cuda = is_hip = is_npu = is_xpu = is_musa = is_gfx95_supported = is_gfx1250_supported = is_fp8_fnuz = _no
fp8_dtype = torch.float8_e4m3fn  # `sglang.kernels.ops.quantization.fp8_kernel`: OCP e4m3, not ROCm's fnuz


def get_bool_env_var(name: str, default: str = "false") -> bool:
    return os.environ.get(name, default).strip().lower() in ("1", "true", "yes", "on")


def add_prefix(name: str, prefix: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def ceil_align(x: int, alignment: int) -> int:
    return ceil_div(x, alignment) * alignment


def get_device_module() -> Any:
    return torch.cpu


def _as_is(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
    return lambda fn: fn


register_custom_op = register_split_op = _as_is

__getattr__ = outside_names(__name__)
