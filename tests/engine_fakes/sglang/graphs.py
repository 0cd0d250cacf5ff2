"""The graph-context probes of `sglang.srt.model_executor.runner_backend_utils`: no breakable or piecewise
CUDA graph is ever being captured here."""

from __future__ import annotations

from tests.engine_fakes.sglang.outside import outside_names


def is_in_breakable_cuda_graph() -> bool:
    return False


def is_in_tc_piecewise_cuda_graph() -> bool:
    return False


__getattr__ = outside_names(__name__)
