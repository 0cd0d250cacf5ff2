"""The vLLM plugin on a CUDA device, against the tests/vllm033 stand-in: no host sync on the model's thread,
no copy baked into a CUDA graph, staging through pinned memory. Everything else these tests covered runs
inside the released vLLM modules (tests/test_capture_vllm_real.py, tests/test_capture_vllm_serving.py);
these stay on the stand-in until the released modules' CPU kernel models run on CUDA too."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from logitreplay.archive import Archive, Case
from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_plugin import VllmCapture
from tests.test_capture_sync import DEVICES, held, no_host_sync
from tests.vllm033.steps import Step, prefill_step, run, v41_model

TOP_K = 8
RATIO = 4  # DeepSeek V4's C4A layers: columns are compressed positions
TWO = [(120, 10), (48, 12)]  # request A: 120 tokens, the last 10 in this chunk; B: 48, all in the chunk
ONE = [(96, 16)]
LAYER = "model.layers.0.self_attn.indexer"


pytestmark = pytest.mark.usefixtures("vllm033", "fresh_plugin")


def _layer(device: str = "cpu", keys: int = 64) -> Any:
    return v41_model(1, kv_sources=(0,), index_sources=(0,), candidate_source=-1, sparse_logits=False,
                     ratio=RATIO, top_k=TOP_K, keys=keys, device=device)[0]


def _step(layer: Any, requests: list[tuple[int, int]], seed: int = 0, **kw: Any) -> Step:
    return prefill_step(requests, layer.indexer.k_cache.kv_cache, ratio=RATIO, seed=seed, **kw)


def _capture(tmp_path: Path, policy: str = "every", **kw: Any) -> VllmCapture:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse(policy), **kw)
    capture.install()
    return capture


def _cases(path: Path) -> list[Case]:
    archive = Archive.open(path)
    return sorted((archive.read(c) for c in archive.case_ids()), key=lambda c: c.case_id)


# Shared with tests/test_capture_sglang.py.
def _summaries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(path.glob("capture-summary-*.json"))]


def _await_summary(path: Path, captured: int) -> None:
    """Wait (up to 30 s) until the summary on disk counts `captured` cases: a writer counts a case, then
    rewrites its summary, and a SIGKILL leaves the last summary written, so a process killed to test that
    is killed after it."""
    deadline = time.monotonic() + 30
    while [s["captured"] for s in _summaries(path)] != [captured] and time.monotonic() < deadline:
        time.sleep(0.01)


def _assert_exact(case: Case, step: Step, written: torch.Tensor, rows: slice = slice(None)) -> None:
    """Row r of the case is the in-bounds part of what the top-k read, bit for bit; the reference indices
    are what it wrote."""
    chunk = step.metadata.prefill.chunks[0]
    ks, ke = chunk.cu_seqlen_ks[rows].cpu(), chunk.cu_seqlen_ke[rows].cpu()
    read = step.seen[-1]  # the strided view the top-k read (`.cpu()` of a CUDA view is contiguous)
    seen = read.cpu()
    assert case.row_starts.tolist() == [0] * case.rows  # compressed: every row from column 0
    assert case.row_ends.tolist() == (ke - ks).tolist()
    assert case.cols == chunk.max_seqlen_k and case.row_stride == read.stride(0) > case.cols
    assert np.isfinite(case.values).all()  # nothing of the NaN / 3e38 garbage past each row's end
    for r in range(case.rows):
        assert torch.equal(case.row(r).view(torch.int32), seen[r, : int(ke[r] - ks[r])].view(torch.int32))
    assert case.reference_indices is not None and (case.reference_indices == written.cpu().numpy()).all()


@pytest.mark.parametrize("device", DEVICES)
def test_the_plugin_never_syncs_the_model_thread(device: str, tmp_path: Path) -> None:
    capture = _capture(tmp_path, "")
    layer = _layer(device)
    run(layer, _step(layer, ONE))  # the first call opens the writer
    deadline = time.monotonic() + 60
    while capture.writer is not None and capture.writer.captured < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # and is written before the sync check, which is process-wide on CUDA
    assert capture.writer is not None and capture.writer.captured == 1
    two = _step(layer, TWO)
    with held(capture.writer), no_host_sync(device):
        run(layer, two)  # the stand-in kernels do not sync either
    summary = capture.close()
    assert capture.error is None and summary is not None and summary["error"] is None
    assert summary["captured"] == 2
    case = next(c for c in _cases(tmp_path / "cap.zarr") if c.attrs["chunk"]["requests"] == 2)
    _assert_exact(case, two, layer.indexer.topk_indices_buffer[: two.tokens])
    assert case.attrs["device"] == (torch.cuda.get_device_name() if device == "cuda" else "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_capture_skips_graph_capture_and_stages_through_pinned_memory(tmp_path: Path) -> None:
    import vllm._custom_ops as ops

    capture = _capture(tmp_path)
    layer = _layer("cuda")
    step = _step(layer, TWO)
    run(layer, step)  # captured once, as usual
    deadline = time.monotonic() + 60
    while capture.writer is not None and capture.writer.captured < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # a graph capture forbids the writer's host allocations and syncs: let it finish
    logits = step.seen[-1].clone()
    chunk = step.metadata.prefill.chunks[0]
    ends = chunk.cu_seqlen_ke - chunk.cu_seqlen_ks
    static_out = torch.empty(step.tokens, TOP_K, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.top_k_per_row_prefill(logits, torch.zeros_like(ends), ends, static_out, step.tokens,
                                  logits.stride(0), 1, TOP_K)
    graph.replay()
    torch.cuda.synchronize()
    summary = capture.close()
    assert summary is not None and summary["captured"] == 1 and capture.error is None
    [case] = _cases(tmp_path / "cap.zarr")
    _assert_exact(case, step, layer.indexer.topk_indices_buffer[: step.tokens])
    assert case.attrs["device"] == torch.cuda.get_device_name()
