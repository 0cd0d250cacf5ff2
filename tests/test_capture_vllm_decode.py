"""The vLLM plugin on vLLM 0.33's decode call site (tests/vllm033: `sparse_attn_indexer`'s decode branch ->
`get_indexer_topk(backend)(logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len)` ->
`SparseIndexerTopk.forward` -> cooperative_topk / persistent_topk / top_k_per_row_decode): decode cases
with their facts, replayed with --strict; never staged while a CUDA graph is captured or in vLLM's dummy
runs; no host sync on the model's thread."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.capture import serving
from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_plugin import VllmCapture
from logitreplay.cli import main
from tests.test_capture_sync import DEVICES, held, no_host_sync
from tests.vllm033.steps import Step, decode_step, run, v41_model

LAYER = "model.layers.0.self_attn.indexer"
MAX_MODEL_LEN = 640  # the decode logits' width (V4: the model's max_model_len // compress_ratio)


pytestmark = pytest.mark.usefixtures("vllm033", "fresh_plugin")


def _layer(top_k: int, rows: int, keys: int, device: str = "cpu") -> Any:
    layer = v41_model(1, kv_sources=(0,), index_sources=(0,), candidate_source=-1, sparse_logits=False, ratio=4,
                      top_k=top_k, keys=keys, tokens=rows, device=device)[0]
    layer.indexer.indexer_op.max_model_len = MAX_MODEL_LEN
    return layer


def _capture(tmp_path: Path, policy: str = "every") -> VllmCapture:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse(policy))
    capture.install()
    return capture


def _cases(path: Path) -> list[Case]:
    archive = Archive.open(path)
    return sorted((archive.read(c) for c in archive.case_ids()), key=lambda c: c.case_id)


def _replays_strict(path: Path, tmp_path: Path) -> list[dict[str, Any]]:
    report = tmp_path / "replay.json"
    result = CliRunner().invoke(main, ["replay", str(path), "--strict", "--json", str(report)])
    assert result.exit_code == 0, result.output
    cases: list[dict[str, Any]] = json.loads(report.read_text())["cases"]
    assert all(r["status"] == "ok" for c in cases for r in c["results"]), cases
    return cases


def _assert_reference_is_topk(case: Case) -> None:
    assert case.reference_indices is not None
    for r in range(case.rows):
        row = case.row(r)
        k = min(case.top_k, row.numel())
        ref = torch.from_numpy(case.reference_indices[r]).long()
        assert (ref[:k] >= 0).all() and (ref[k:] == -1).all()
        assert torch.equal(row[ref[:k]].sort().values, row.topk(k).values.sort().values), f"row {r}"


@pytest.mark.parametrize(("lens", "next_n", "top_k", "backend"), [
    ([600, 7, 300], 1, 512, "cooperative"),  # rows <= 64 and top_k in (512, 1024, 2048): vLLM's auto
    ([600, 7, 300], 2, 512, "cooperative"),  # native MTP: (batch, next_n) per-row seq_lens
    ([40 + 9 * b for b in range(33)], 2, 512, "persistent"),  # 66 rows: past cooperative's 64
    ([600, 7, 300], 2, 8, "per_row"),  # a top_k the fast kernels are not built for
])
def test_decode_calls_become_decode_cases(lens: list[int], next_n: int, top_k: int, backend: str,
                                          tmp_path: Path) -> None:
    layer = _layer(top_k, len(lens) * next_n, sum(lens))
    step = decode_step(lens, layer.indexer.k_cache.kv_cache, next_n=next_n, max_seq_len=4 * max(lens))
    capture = _capture(tmp_path)
    run(layer, step)
    summary = capture.close()
    assert summary is not None and summary["error"] is None and summary["captured"] == 1
    (case,) = _cases(tmp_path / "cap.zarr")
    facts = case.decode
    assert facts is not None and case.kind == "decode"
    assert (facts.batch, facts.next_n, facts.backend, facts.speculative) == (len(lens), next_n, backend, next_n > 1)
    assert facts.seq_lens == tuple(tuple(r) for r in step.metadata.decode.seq_lens.tolist())
    assert facts.max_seq_len == 4 * max(lens) and facts.max_model_len == case.cols == MAX_MODEL_LEN
    assert case.row_starts.tolist() == [0] * case.rows
    want_ends = [max(0, n - next_n + 1 + j) for n in lens for j in range(next_n)]
    assert case.row_ends.tolist() == want_ends
    (seen,) = step.seen  # the paged logits the kernel read: every in-range cell kept exactly
    for r, end in enumerate(want_ends):
        assert torch.equal(case.row(r), seen[r, :end])
    a = case.attrs
    assert a["layer_name"] == LAYER and a["layer_index"] == 0 and a["logits_kind"] == "paged_mqa_logits"
    assert a["index_source"] == "input of vLLM SparseIndexerTopk.forward (decode)"
    assert a["chunk"]["requests"] == len(lens)
    _assert_reference_is_topk(case)
    (replayed,) = _replays_strict(tmp_path / "cap.zarr", tmp_path)
    assert replayed["kind"] == "decode" and f"decode b{len(lens)} n{next_n}" in replayed["source"]


def test_the_op_called_directly_is_captured_once(tmp_path: Path) -> None:
    """Builds that call `top_k_per_row_decode` themselves: the op site; inside `forward` (above) the same
    op is the inner call and the forward's capture is the only one."""
    from vllm import _custom_ops as ops

    capture = _capture(tmp_path)
    logits = torch.randn(4, 64)
    seq_lens = torch.tensor([[30], [64]], dtype=torch.int32)  # (batch, 1) with next_n 2
    out = torch.empty(4, 16, dtype=torch.int32)
    ops.top_k_per_row_decode(logits, 2, seq_lens, out, 4, logits.stride(0), logits.stride(1), 16)
    capture.close()
    (case,) = _cases(tmp_path / "cap.zarr")
    assert case.decode is not None and case.decode.seq_lens == ((30,), (64,)) and case.decode.backend == "per_row"
    assert case.row_ends.tolist() == [29, 30, 63, 64] and case.decode.max_seq_len == 64
    _assert_reference_is_topk(case)


def _one_step(top_k: int = 8, device: str = "cpu") -> tuple[Any, Step]:
    layer = _layer(top_k, 6, 400, device)
    return layer, decode_step([200, 90, 110], layer.indexer.k_cache.kv_cache, next_n=2)


def test_nothing_is_staged_while_a_graph_is_captured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph check sees the call's logits (a method's first argument is the module) and stops it."""
    asked: list[Any] = []

    def capturing(t: Any) -> bool:
        asked.append(t)
        return True

    monkeypatch.setattr(serving, "_capturing_graph", capturing)
    capture = _capture(tmp_path)
    layer, step = _one_step()
    run(layer, step)
    assert capture.writer is None and asked and all(isinstance(t, torch.Tensor) for t in asked)
    assert asked[0].shape == (6, MAX_MODEL_LEN)


def _dummy_run(layer: Any, step: Step) -> None:
    """Named as vLLM's model runner's warmup on dummy inputs."""
    run(layer, step)


def test_dummy_runs_are_not_captured_and_the_default_keeps_each_layers_first_real_call(tmp_path: Path) -> None:
    capture = _capture(tmp_path, policy="")
    layer, step = _one_step()
    _dummy_run(layer, decode_step([50, 60, 70], layer.indexer.k_cache.kv_cache, next_n=2))
    run(layer, step)
    run(layer, decode_step([201, 91, 111], layer.indexer.k_cache.kv_cache, next_n=2))  # same layer and width
    capture.close()
    (case,) = _cases(tmp_path / "cap.zarr")
    assert case.row_ends.tolist() == [199, 200, 89, 90, 109, 110]


def test_the_default_keeps_one_decode_call_per_batch_bucket(tmp_path: Path) -> None:
    """6 and 8 rows (batch 3 and 4, next_n 2) share the power-of-two bucket 8; 10 rows are the next."""
    capture = _capture(tmp_path, policy="")
    layer = _layer(8, 10, 400)
    kv = layer.indexer.k_cache.kv_cache
    for lens in ([50, 60, 70], [40, 50, 60, 70], [30, 40, 50, 60, 70]):
        run(layer, decode_step(lens, kv, next_n=2))
    capture.close()
    assert sorted(c.rows for c in _cases(tmp_path / "cap.zarr")) == [6, 10]
    _replays_strict(tmp_path / "cap.zarr", tmp_path)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_capture_never_syncs_the_model_thread(device: str, tmp_path: Path) -> None:
    layer, step = _one_step(device=device)
    capture = _capture(tmp_path)
    run(layer, step)  # the stand-in's first call (backend resolution, op lookup) outside the check
    deadline = time.monotonic() + 60  # its case written before the check: sync debug mode is process-wide
    while capture.writer is not None and capture.writer.summary()["captured"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    with held(capture.writer), no_host_sync(device):
        run(layer, step)
    summary = capture.close()
    assert summary is not None and summary["error"] is None and summary["captured"] == 2
    for case in _cases(tmp_path / "cap.zarr"):
        assert case.kind == "decode"
        _assert_reference_is_topk(case)


@pytest.mark.gpu
def test_a_decode_step_in_a_cuda_graph_is_never_baked_into_it(tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    layer, step = _one_step(device="cuda")
    capture = _capture(tmp_path)
    run(layer, step)  # eager: captured
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        run(layer, step)  # warm on the side stream: captured as well (an eager call)
        with torch.cuda.graph(graph, stream=side):
            run(layer, step)  # capturing: not staged
    for _ in range(3):
        graph.replay()  # Python does not run: nothing to capture, and no copy was recorded into the graph
    torch.cuda.synchronize()
    summary = capture.close()
    assert summary is not None and summary["error"] is None and summary["captured"] == 2
