"""The environment a replay ran in, probed once: what a reader needs to trust or reproduce the numbers.

One probe, one set of keys, for the report's JSON and for `compare`'s check that two runs are comparable.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from typing import Any

import numpy as np
import torch

from logitreplay.selectors.provenance import kernel_sources


def environment(device: torch.device) -> dict[str, Any]:
    """What a reader needs to trust or reproduce the numbers: versions, CPU, the source digest of each
    bundled kernel on this device kind (`kernel_sources`: which code a table's figures came from), and
    on CUDA the GPU, driver, CUDA runtime and the SM clock at the start (the command adds the clock at
    the end)."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "host": platform.node(),  # which machine (a merge of several jobs' reports names each one's)
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "kernel_sources": kernel_sources(device.type),
    }
    if device.type == "cuda":
        env.update(_gpu(device))
    return env


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def sm_clock_mhz(device: torch.device) -> int | None:
    """The SM clock right now (pynvml, else nvidia-smi), or None where neither is available."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
    except Exception:  # no pynvml, or NVML not usable here: try the command line
        pass
    text = _smi_query(index, "clocks.sm")
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def _driver_version(index: int) -> str | None:
    return _smi_query(index, "driver_version")


def _smi_query(index: int, field: str) -> str | None:
    """One `nvidia-smi --query-gpu` field of GPU `index`, or None where nvidia-smi is missing or fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        text = subprocess.run([smi, "-i", str(index), f"--query-gpu={field}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = text.strip().splitlines()
    return lines[0].strip() if lines and lines[0].strip() else None


def _gpu(device: torch.device) -> dict[str, Any]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    return {
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": int(getattr(props, "L2_cache_size", 0)),
        "memory_bytes": int(props.total_memory),
        "driver": _driver_version(index),
        "cuda_runtime": torch.version.cuda,
        "sm_clock_mhz_start": sm_clock_mhz(torch.device("cuda", index)),
    }


__all__ = ["environment", "sm_clock_mhz"]
