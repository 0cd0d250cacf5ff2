"""The vLLM plugin's call record on the tests/vllm033 stand-in: calls refused by the ranks and the policy
are counted, and counting never syncs on a CUDA device. Steps, warm-ups and `replay --per-forward` run
inside the released vLLM modules (tests/test_capture_vllm_serving.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_plugin import VllmCapture
from tests.test_capture_sync import DEVICES, held, no_host_sync
from tests.test_capture_vllm_serving import _record, _serve
from tests.vllm033.steps import prefill_step, v41_model

TOP_K, RATIO, LAYERS = 8, 4, 3
FIRST, SECOND = [(120, 10), (48, 12)], [(96, 16)]  # 22 rows 30 wide, then 16 rows 24 wide
RUNNERS = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")


pytestmark = pytest.mark.usefixtures("vllm033", "fresh_plugin")


def _runner(module: str, device: str = "cpu") -> Any:
    import importlib

    layers = v41_model(LAYERS, kv_sources=tuple(range(LAYERS)), index_sources=tuple(range(LAYERS)),
                       candidate_source=-1, sparse_logits=False, ratio=RATIO, top_k=TOP_K, keys=64, device=device)
    return importlib.import_module(module).GPUModelRunner(layers, device)


def _scheduled(runner: Any, requests: list[tuple[int, int]], seed: int = 0) -> Any:
    from vllm.v1.worker.gpu_model_runner import SchedulerOutput

    step = prefill_step(requests, runner.layers[0].indexer.k_cache.kv_cache, ratio=RATIO, seed=seed)
    return SchedulerOutput(step.tokens, step.metadata, step.q, step.weights)


def test_calls_refused_by_the_ranks_and_after_the_policy_is_done_are_counted(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("layers=0"), ranks={0})
    capture.install()
    runner = _runner(RUNNERS[0])
    same = _scheduled(runner, FIRST)
    _serve(runner, same, same, same)  # the policy takes layer 0's width 30 once: the rest is refused
    summary = capture.close()
    assert summary is not None and summary["captured"] == 1 and summary["calls"] == 3 * LAYERS
    assert [f.n_calls for f in _record(tmp_path / "cap.zarr").forwards] == [LAYERS] * 3
    capture.uninstall()
    import vllm.distributed as dist

    monkeypatch.setattr(dist, "_TP_RANK", 1)  # a rank the capture does not want: nothing stored, no record
    other = VllmCapture(tmp_path / "other.zarr", Policy.parse("every"), ranks={0})
    other.install()
    _serve(runner, same)
    assert other.steps.counted and other.close() is None and not (tmp_path / "other.zarr").exists()


@pytest.mark.parametrize("device", DEVICES)
def test_counting_never_syncs_the_model_thread(device: str, tmp_path: Path) -> None:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("layers=0"))
    capture.install()
    runner = _runner(RUNNERS[1], device)
    first = _scheduled(runner, FIRST)
    _serve(runner, first)  # the stand-in's first calls (op lookup) and layer 0's case outside the check
    assert capture.writer is not None
    with held(capture.writer), no_host_sync(device):
        _serve(runner, first, first)  # layers 1, 2 refused, layer 0 done: counted only
    summary = capture.close()
    assert summary is not None and summary["error"] is None and summary["calls"] == 3 * LAYERS
    assert _record(tmp_path / "cap.zarr").timer == ("cuda-events" if device == "cuda" else "wall")
