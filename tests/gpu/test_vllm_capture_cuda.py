"""The vLLM plugin on a CUDA device, inside the released vLLM 0.33.0 and 0.34.0 (tests/upstream_wheels.py):
no stream sync under torch's sync debug mode, nothing staged while a real CUDA graph is captured (and the
graph replays), staging through pinned host memory on the writer's own stream.

The call is the decode top-k as `sparse_attn_indexer` makes it: the released `SparseIndexerTopk.forward`
with its `torch` backend, device ops only (mask past each row's end, `topk`, -1 past it), so the released
code runs unchanged on CUDA, under sync debug mode and inside a graph; the fakes (tests/engine_fakes/vllm)
only load the release, with a CUDA platform. The plugin's staging, its writer and its graph check are the
same for every site; each site's reading of a call is proven free of host reads on CPU
(tests/test_capture_vllm_serving.py::test_the_plugin_never_syncs_the_model_thread)."""

from __future__ import annotations

import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from logitreplay.capture import writer as capture_writer
from logitreplay.capture.vllm_plugin import VllmCapture
from tests.engine_fakes.vllm.checks import cases, plugin, summary
from tests.engine_fakes.vllm.edges import CudaPlatform, Edges, _module, fakes
from tests.engine_fakes.vllm.runner import Indexer
from tests.test_capture_sync import held, no_host_sync

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
TOP_K, WIDTH = 64, 4096  # WIDTH: max_model_len, the decode logits' width
SEQ_LENS = [1500, 40, 4096]  # the middle row is shorter than TOP_K: -1 past its end


def _modules(edges: Edges) -> dict[str, Callable[[str], types.ModuleType]]:
    return {**fakes(edges), "vllm.platforms": lambda n: _module(n, {"current_platform": CudaPlatform()}, inert=True)}


class _Layer:
    """A layer whose indexer's decode top-k is the released `SparseIndexerTopk` with the `torch` backend,
    called with the arguments `sparse_attn_indexer`'s decode branch passes."""

    def __init__(self) -> None:
        self.indexer = Indexer("model.layers.0.self_attn.indexer")
        module = __import__("vllm.model_executor.layers.indexer_topk", fromlist=["x"])
        self.topk = module.get_indexer_topk("torch")

    def decode(self, logits: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor) -> None:
        self.topk(logits, seq_lens, 1, out, TOP_K, max(SEQ_LENS))


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = torch.randn(len(SEQ_LENS), WIDTH, device="cuda", generator=g)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int32, device="cuda")[:, None]
    return logits, seq_lens, torch.full((len(SEQ_LENS), TOP_K), -7, dtype=torch.int32, device="cuda")


def _written(capture: VllmCapture, count: int) -> None:
    """Waits until the writer has written `count` cases and let go of their host buffers: its thread then
    waits for more, touching no device (a graph capture forbids its calls; sync debug mode is process-wide)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (
            capture.writer is not None and capture.writer.captured == count and capture.writer._pending_bytes == 0):
        time.sleep(0.01)
    assert capture.writer is not None and capture.writer.captured == count and capture.writer._pending_bytes == 0


def _check(path: Path, logits: list[torch.Tensor]) -> None:
    """The decode cases are the given logits' rows within their context lengths (one case per matrix, in
    any order), vLLM's top-k their reference, recorded on this device."""
    found = cases(path)
    hosts = [matrix.cpu() for matrix in logits]
    assert len(found) == len(hosts)
    for case in found:
        assert case.attrs["kind"] == "decode" and case.attrs["decode"]["backend"] == "torch"
        assert case.attrs["device"] == torch.cuda.get_device_name()
        assert case.attrs["layer_name"] == "model.layers.0.self_attn.indexer"
        assert case.row_ends.tolist() == SEQ_LENS
        (host,) = [h for h in hosts if torch.equal(case.row(0), h[0, :SEQ_LENS[0]])]
        for r, end in enumerate(SEQ_LENS):
            assert torch.equal(case.row(r), host[r, :end])
            picked = {int(i) for i in case.reference_indices[r] if i >= 0}
            assert picked == set(torch.topk(host[r, :end], min(TOP_K, end)).indices.tolist())


def test_cuda_capture_never_syncs_the_stream(tree: Path, tmp_path: Path) -> None:
    """With torch's sync debug mode set to error, a captured decode call (the released top-k, the plugin's
    read, the staging copies) runs through: the capture never waits for the stream."""
    edges = Edges()
    first, second = _inputs(1), _inputs(2)
    with plugin(tree, tmp_path, edges, modules=_modules(edges)) as capture:
        layer = _Layer()
        layer.decode(*first)  # opens the writer: its files, its thread
        _written(capture, 1)
        assert capture.writer is not None
        with held(capture.writer), no_host_sync("cuda"):
            layer.decode(*second)
        done = capture.close()
    assert capture.error is None and done is not None and done["error"] is None and done["captured"] == 2
    _check(tmp_path / "cap.zarr", [first[0], second[0]])


def test_nothing_is_staged_while_a_cuda_graph_is_captured_and_the_graph_replays(tree: Path, tmp_path: Path) -> None:
    """The decode call captured into a real CUDA graph stages nothing (no copy baked into the graph, no
    call counted); the graph replays vLLM's top-k on new logits; the eager call before it was captured."""
    edges = Edges()
    logits, seq_lens, out = _inputs(3)
    eager = logits.clone()
    with plugin(tree, tmp_path, edges, modules=_modules(edges)) as capture:
        layer = _Layer()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # the eager warm-up a graph capture wants, captured by the plugin
            layer.decode(logits, seq_lens, out)
        torch.cuda.current_stream().wait_stream(side)
        _written(capture, 1)  # the writer's host copies are not allowed while a graph is captured
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer.decode(logits, seq_lens, out)
        replayed = torch.randn(logits.shape, device="cuda", generator=torch.Generator(device="cuda").manual_seed(4))
        logits.copy_(replayed)
        graph.replay()
        torch.cuda.synchronize()
        done = capture.close()
    assert capture.error is None and done is not None and done["error"] is None and done["captured"] == 1
    assert summary(tmp_path / "cap.zarr")["calls_by_path"]["decode"]["captured"] == 1
    _check(tmp_path / "cap.zarr", [eager])
    for r, end in enumerate(SEQ_LENS):  # the graph ran vLLM's top-k on the replayed logits
        got = {int(i) for i in out[r].tolist() if i >= 0}
        assert got == set(torch.topk(replayed[r, :end], min(TOP_K, end)).indices.tolist())


def test_cuda_cases_are_staged_through_pinned_memory_on_the_writers_stream(tree: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every staged device tensor reaches the host by an async copy into pinned memory, issued on the
    writer's own stream (never the model's), behind the event recorded after the staging copies."""
    copies: list[dict[str, Any]] = []
    pinned_copy = capture_writer._pinned_copy

    def watched(t: torch.Tensor) -> torch.Tensor:
        host = pinned_copy(t)
        copies.append({"from": t.device.type, "pinned": host.is_pinned(),
                       "stream": torch.cuda.current_stream(t.device)})
        return host

    monkeypatch.setattr(capture_writer, "_pinned_copy", watched)
    edges = Edges()
    logits, seq_lens, out = _inputs(5)
    with plugin(tree, tmp_path, edges, modules=_modules(edges)) as capture:
        model_stream = torch.cuda.current_stream()
        _Layer().decode(logits, seq_lens, out)
        done = capture.close()
    assert done is not None and done["error"] is None and done["captured"] == 1
    assert len(copies) >= 3  # the matrix, its bounds, the reference
    assert all(c["from"] == "cuda" and c["pinned"] for c in copies)
    assert all(c["stream"] != model_stream and c["stream"] != torch.cuda.default_stream() for c in copies)
    _check(tmp_path / "cap.zarr", [logits])
