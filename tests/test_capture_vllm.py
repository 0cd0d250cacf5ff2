"""vLLM plugin, tested against a `torch.library` op with exactly vLLM's schema for `top_k_per_row_prefill`
(registered by vLLM's csrc/torch_bindings.cpp), called the way vLLM's indexer calls it: through a
`_custom_ops`-style Python wrapper, from a function whose locals hold `k_cache_prefix` and `chunk`, on a
logits buffer with padded rows and uninitialized memory outside each row's [ks, ke)."""

from __future__ import annotations

import logging
import sys
import time
import tomllib
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from logitreplay.archive import Archive, Case
from logitreplay.capture import vllm_plugin
from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_plugin import VllmCapture
from tests.test_capture_sync import DEVICES, held, no_host_sync

NAMESPACE = "logitreplay_vllm_test"
SCHEMA = ("top_k_per_row_prefill(Tensor logits, Tensor rowStarts, Tensor rowEnds, Tensor! indices, "
          "int numRows, int stride0, int stride1, int topK) -> ()")
LAYER = "model.layers.5.self_attn.indexer.k_cache"
TOP_K = 16
STRIDE = 128  # padded row stride, as DeepGEMM allocates


def _kernel(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, indices: torch.Tensor,
            num_rows: int, stride0: int, stride1: int, top_k: int) -> None:
    """Stand-in kernel with vLLM's contract: relative indices of each row's top-k in [ks, ke), -1 tails.
    Written without host syncs so that it can also run inside a CUDA graph."""
    view = logits.as_strided((num_rows, logits.shape[1]), (stride0, stride1))
    cols = torch.arange(view.shape[1], device=view.device)
    ks, ke = row_starts[:num_rows, None].long(), row_ends[:num_rows, None].long()
    valid = (cols >= ks) & (cols < ke)
    k = min(top_k, view.shape[1])
    top = torch.where(valid, view, float("-inf")).topk(k, dim=1).indices
    rel = torch.where(valid.gather(1, top), top - ks, -1)
    indices[:num_rows, :k] = rel.to(torch.int32)
    indices[:num_rows, k:top_k] = -1


@pytest.fixture(scope="module")
def op_namespace() -> Iterator[object]:
    lib = torch.library.Library(NAMESPACE, "DEF")
    lib.define(SCHEMA)
    lib.impl("top_k_per_row_prefill", _kernel, "CPU")
    lib.impl("top_k_per_row_prefill", _kernel, "CUDA")
    yield getattr(torch.ops, NAMESPACE)
    del lib


@pytest.fixture
def ops(op_namespace: object) -> types.ModuleType:
    """Like `vllm._custom_ops`: a Python function forwarding to the registered op."""
    module = types.ModuleType("custom_ops")

    def top_k_per_row_prefill(logits, row_starts, row_ends, indices, num_rows, stride0, stride1, top_k):  # type: ignore[no-untyped-def]
        getattr(torch.ops, NAMESPACE).top_k_per_row_prefill(logits, row_starts, row_ends, indices, num_rows,
                                                             stride0, stride1, top_k)

    module.top_k_per_row_prefill = top_k_per_row_prefill  # type: ignore[attr-defined]
    return module


@pytest.fixture
def installed(tmp_path: Path, ops: types.ModuleType, op_namespace: object) -> Iterator[VllmCapture]:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("every"))
    assert capture.install(ops, op_namespace) == 2
    yield capture
    capture.uninstall()


@dataclass
class Chunk:
    """The facts vLLM's prefill chunk metadata carries that the plugin records."""

    cu_seqlen_ks: torch.Tensor
    cu_seqlen_ke: torch.Tensor
    token_start: int
    token_end: int


def indexer_prefill(ops: object, logits: torch.Tensor, chunk: Chunk, k_cache_prefix: str) -> torch.Tensor:
    """Calls the op as vLLM's `sparse_attn_indexer` does for one prefill chunk."""
    topk_indices = torch.full((logits.shape[0], TOP_K), -7, dtype=torch.int32, device=logits.device)
    ops.top_k_per_row_prefill(logits, chunk.cu_seqlen_ks, chunk.cu_seqlen_ke, topk_indices,  # type: ignore[attr-defined]
                              logits.shape[0], logits.stride(0), logits.stride(1), TOP_K)
    return topk_indices


def two_request_chunk(device: str = "cpu") -> tuple[torch.Tensor, Chunk]:
    """Request A (30 context keys, last 10 tokens in this chunk) and request B (12 keys, all in the chunk):
    keys concatenated into 42 columns; rows sit inside a buffer padded to STRIDE, filled with garbage."""
    g = torch.Generator().manual_seed(0)
    storage = torch.full((22, STRIDE), float("nan"))
    storage[:, ::3] = 3e38  # uninitialized memory: NaN and huge values everywhere outside [ks, ke)
    ks = torch.tensor([0] * 10 + [30] * 12, dtype=torch.int32)
    ke = torch.tensor([21 + i for i in range(10)] + [31 + i for i in range(12)], dtype=torch.int32)
    for r in range(22):
        storage[r, ks[r]:ke[r]] = torch.randn(int(ke[r] - ks[r]), generator=g)
    storage = storage.to(device)
    return storage[:, :42], Chunk(ks.to(device), ke.to(device), token_start=100, token_end=122)


def _only_case(path: Path) -> Case:
    archive = Archive.open(path)
    assert len(archive.case_ids()) == 1, archive.case_ids()
    return archive.read(archive.case_ids()[0])


def _assert_matches(case: Case, logits: torch.Tensor, chunk: Chunk, written: torch.Tensor) -> None:
    logits, ks, ke, written = logits.cpu(), chunk.cu_seqlen_ks.cpu(), chunk.cu_seqlen_ke.cpu(), written.cpu()
    assert case.rows == 22 and case.cols == 42 and case.row_stride == STRIDE and case.top_k == TOP_K
    assert case.row_starts.tolist() == ks.tolist() and case.row_ends.tolist() == ke.tolist()
    assert np.isfinite(case.values).all()  # only [ks, ke) was copied, never the garbage around it
    for r in range(22):
        assert torch.equal(case.row(r), logits[r, int(ks[r]):int(ke[r])])
    assert case.reference_indices is not None
    assert (case.reference_indices == written.numpy()).all()
    padded = case.padded()
    assert padded.stride(0) == STRIDE


def test_captures_multi_request_chunk_exactly(installed: VllmCapture, ops: types.ModuleType, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(vllm_plugin.ENV_MODEL, "org/served-model")
    vllm_plugin._model_facts.cache_clear()
    logits, chunk = two_request_chunk()
    written = indexer_prefill(ops, logits, chunk, LAYER)
    summary = installed.close()
    assert summary is not None and summary["captured"] == 1  # once, although both wrappers saw the call
    case = _only_case(tmp_path / "cap.zarr")
    _assert_matches(case, logits, chunk, written)
    a = case.attrs
    assert a["layer_name"] == LAYER and a["layer_index"] == 5 and a["tp_rank"] == 0 and a["rank"] == 0
    assert a["chunk"] == {"requests": 2, "token_start": 100, "token_end": 122}
    assert a["index_source"] == "input of vLLM top_k_per_row_prefill" and a["device"] == "cpu"
    assert a["model"] == "org/served-model" and a["model_source"] == "hub"
    vllm_plugin._model_facts.cache_clear()


def test_direct_namespace_calls_are_captured(installed: VllmCapture, op_namespace: object, tmp_path: Path) -> None:
    logits, chunk = two_request_chunk()
    written = indexer_prefill(op_namespace, logits, chunk, LAYER)  # older builds call torch.ops._C directly
    installed.close()
    _assert_matches(_only_case(tmp_path / "cap.zarr"), logits, chunk, written)


def test_default_policy_once_per_layer_and_width(tmp_path: Path, ops: types.ModuleType) -> None:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy())
    capture.install(ops)
    try:
        logits, chunk = two_request_chunk()
        for layer in (LAYER, LAYER, "model.layers.6.self_attn.indexer.k_cache"):
            indexer_prefill(ops, logits, chunk, layer)
        summary = capture.close()
    finally:
        capture.uninstall()
    assert summary is not None and summary["captured"] == 2
    assert summary["widths"] == {LAYER: [42], "model.layers.6.self_attn.indexer.k_cache": [42]}


def test_single_request_policy_skips_multi_request_chunks(tmp_path: Path, ops: types.ModuleType) -> None:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("every,single-request"))
    capture.install(ops)
    try:
        logits, chunk = two_request_chunk()
        indexer_prefill(ops, logits, chunk, LAYER)
        single = Chunk(torch.zeros(22, dtype=torch.int32), torch.arange(21, 43, dtype=torch.int32), 0, 22)
        indexer_prefill(ops, torch.randn(22, 42), single, LAYER)
        summary = capture.close()
    finally:
        capture.uninstall()
    assert summary is not None and summary["captured"] == 1 and summary["skipped"] == {"multi_request": 1}


def test_other_tensor_parallel_ranks_do_not_capture(tmp_path: Path, ops: types.ModuleType) -> None:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("every"), ranks={1})
    capture.install(ops)
    try:
        logits, chunk = two_request_chunk()
        indexer_prefill(ops, logits, chunk, LAYER)
    finally:
        capture.uninstall()
    assert capture.close() is None and not (tmp_path / "cap.zarr").exists()


def test_nothing_is_captured_while_a_graph_is_captured(installed: VllmCapture, ops: types.ModuleType,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_plugin, "_capturing_graph", lambda logits: True)
    logits, chunk = two_request_chunk()
    indexer_prefill(ops, logits, chunk, LAYER)
    assert installed.writer is None


def test_bad_bounds_disable_capture_but_not_the_kernel(installed: VllmCapture, ops: types.ModuleType,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    logits, chunk = two_request_chunk()
    chunk.cu_seqlen_ke[3] = 500  # beyond the matrix: refused on the host, never read past the row
    with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
        written = indexer_prefill(ops, logits, chunk, LAYER)
        assert installed.writer is not None
        deadline = time.monotonic() + 30
        while not installed.writer.failed and time.monotonic() < deadline:  # the writer sees the bounds
            time.sleep(0.01)
        indexer_prefill(ops, logits, chunk, LAYER)
        summary = installed.close()
    expected = torch.empty_like(written)
    _kernel(logits, chunk.cu_seqlen_ks, chunk.cu_seqlen_ke, expected, 22, STRIDE, 1, TOP_K)
    assert torch.equal(written, expected)  # the production result is untouched
    assert not installed.enabled and summary is not None and summary["captured"] == 0
    assert "row 3 violates 0 <= start <= end <= cols (start=0, end=500, cols=42)" in summary["error"]
    assert len([r for r in caplog.records if "capture disabled" in r.getMessage()]) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_the_plugin_never_syncs_the_model_thread(device: str, ops: types.ModuleType, tmp_path: Path) -> None:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy())
    capture.install(ops)
    try:
        logits, chunk = two_request_chunk(device)
        indexer_prefill(ops, logits, chunk, LAYER)  # the first call opens the writer
        deadline = time.monotonic() + 60
        while capture.writer is not None and capture.writer.captured < 1 and time.monotonic() < deadline:
            time.sleep(0.01)  # and is written before the sync check, which is process-wide on CUDA
        assert capture.writer is not None and capture.writer.captured == 1
        other = "model.layers.6.self_attn.indexer.k_cache"
        with held(capture.writer), no_host_sync(device):
            written = indexer_prefill(ops, logits, chunk, other)  # the first of its (layer, width): kept
            indexer_prefill(ops, logits, chunk, LAYER)  # refused from its shape
        summary = capture.close()
    finally:
        capture.uninstall()
    assert capture.error is None and summary is not None and summary["error"] is None
    assert summary["captured"] == 2 and summary["widths"] == {LAYER: [42], other: [42]}
    case = next(c for c in Archive.open(tmp_path / "cap.zarr") if c.attrs["layer_name"] == other)
    _assert_matches(case, logits, chunk, written)
    assert case.attrs["chunk"] == {"requests": 2, "token_start": 100, "token_end": 122}


def test_uninstall_restores_the_originals(tmp_path: Path, ops: types.ModuleType, op_namespace: object) -> None:
    before = (ops.top_k_per_row_prefill, op_namespace.top_k_per_row_prefill)  # type: ignore[attr-defined]
    capture = VllmCapture(tmp_path / "cap.zarr", Policy())
    capture.install(ops, op_namespace)
    assert ops.top_k_per_row_prefill is not before[0]  # type: ignore[attr-defined]
    # code that inspects the op (its overloads, its schema) still sees the original's
    assert op_namespace.top_k_per_row_prefill.default is before[1].default  # type: ignore[attr-defined]
    capture.uninstall()
    assert (ops.top_k_per_row_prefill, op_namespace.top_k_per_row_prefill) == before  # type: ignore[attr-defined]


def test_plugin_is_registered_and_off_without_its_variable(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["vllm.general_plugins"]["logitreplay_capture"]
    assert target == "logitreplay.capture.vllm_plugin:register"
    monkeypatch.delenv(vllm_plugin.ENV_DIR, raising=False)
    vllm_plugin.register()  # a no-op: nothing imported, nothing patched
    assert vllm_plugin._active is None
    monkeypatch.setenv(vllm_plugin.ENV_DIR, str(tmp_path / "cap.zarr"))
    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM absent: log, never raise
    with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
        vllm_plugin.register()
    assert vllm_plugin._active is None and "capture not enabled" in caplog.text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_capture_skips_graph_capture_and_stages_through_pinned_memory(
        installed: VllmCapture, ops: types.ModuleType, tmp_path: Path) -> None:
    logits, chunk = two_request_chunk("cuda")
    static_out = torch.empty(22, TOP_K, dtype=torch.int32, device="cuda")
    indexer_prefill(ops, logits, chunk, LAYER)  # warm up outside the graph (captured once, as usual)
    deadline = time.monotonic() + 60
    while installed.writer is not None and installed.writer.captured < 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # a graph capture forbids the writer's host allocations and syncs: let it finish
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.top_k_per_row_prefill(logits, chunk.cu_seqlen_ks, chunk.cu_seqlen_ke, static_out, 22,  # type: ignore[attr-defined]
                                  logits.stride(0), 1, TOP_K)
    graph.replay()
    written = indexer_prefill(ops, logits, chunk, LAYER)
    torch.cuda.synchronize()
    summary = installed.close()
    assert summary is not None and summary["captured"] == 2 and installed.error is None
    archive = Archive.open(tmp_path / "cap.zarr")
    for cid in archive.case_ids():
        case = archive.read(cid)
        _assert_matches(case, logits, chunk, written)
        assert case.attrs["device"] == torch.cuda.get_device_name()
