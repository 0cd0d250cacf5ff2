"""The vLLM plugin against call sites that reproduce vLLM 0.33's (tests/vllm033: module paths, function and
local names, the op schemas, compressed logits with garbage past each row's end and a padded stride):
prefill through `sparse_attn_indexer`, worker processes forked by multiprocessing that end in os._exit,
SIGKILL, tensor-parallel row windows, and the policy on multi-request chunks."""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing
import os
import signal
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from logitreplay.archive import Archive, Case
from logitreplay.capture import serving, vllm_plugin
from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_plugin import VllmCapture
from logitreplay.capture.writer import count_requests
from logitreplay.cli import main
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


def _worker(out: str, policy: str, kill: bool) -> None:
    """A vLLM worker: the plugin is loaded in the process, two chunks are captured, and the process ends as
    a forked multiprocessing child does (os._exit after multiprocessing's exit function), or is SIGKILLed."""
    torch.set_num_threads(1)  # the parent's OpenMP pool does not survive the fork
    os.environ[serving.ENV_DIR] = out
    os.environ[serving.ENV_POLICY] = policy
    vllm_plugin.register()
    layer = _layer()
    for seed, requests in enumerate((TWO, ONE)):
        step = _step(layer, requests, seed)
        run(layer, step)
        torch.save({"seen": step.seen[-1], "written": layer.indexer.topk_indices_buffer[: step.tokens].clone()},
                   f"{out}.{seed}.pt")
    if kill:
        assert serving._active is not None and serving._active.writer is not None
        _await_summary(Path(out), 2)
        os.kill(os.getpid(), signal.SIGKILL)


def _fork(target: Any, *args: Any) -> int | None:
    process = multiprocessing.get_context("fork").Process(target=target, args=args, daemon=True)
    process.start()
    process.join(120)
    return process.exitcode


def test_forked_worker_leaves_both_cases_and_its_summary(tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    assert _fork(_worker, str(out), "every", False) == 0
    cases = _cases(out)
    assert [c.attrs["chunk"]["requests"] for c in cases] == [2, 1]
    for seed, (case, requests) in enumerate(zip(cases, (TWO, ONE), strict=True)):
        saved = torch.load(f"{out}.{seed}.pt")
        step = Step(None, None, None, 0, [saved["seen"]])  # type: ignore[arg-type]
        step.metadata = prefill_step(requests, torch.zeros(64, 16), ratio=RATIO).metadata
        _assert_exact(case, step, saved["written"])
    a = cases[0].attrs
    assert a["chunk"]["layout"] == "compressed" and a["chunk"]["row_key_offsets"] == [[0, 10, 0], [10, 22, 30]]
    assert a["chunk"]["max_seqlen_k"] == 30 and (a["chunk"]["token_start"], a["chunk"]["token_end"]) == (0, 22)
    assert a["layer_name"] == LAYER and a["layer_index"] == 0 and a["compress_ratio"] == RATIO
    assert a["engine_version"] == "0.33.0" and a["index_source"] == "input of vLLM top_k_per_row_prefill"
    [summary] = _summaries(out)
    assert summary["final"] and summary["captured"] == 2 and summary["error"] is None
    result = CliRunner().invoke(main, ["replay", str(out), "--strict"])
    assert result.exit_code == 0, result.output


def test_sigkilled_worker_leaves_every_completed_case_and_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    assert _fork(_worker, str(out), "every", True) == -signal.SIGKILL
    assert [c.attrs["chunk"]["requests"] for c in _cases(out)] == [2, 1]
    [summary] = _summaries(out)
    assert summary["captured"] == 2 and not summary["final"]


def test_single_request_policy_skips_the_two_request_chunk(tmp_path: Path) -> None:
    capture = _capture(tmp_path, "every,single-request")
    layer = _layer()
    run(layer, _step(layer, TWO))
    run(layer, one := _step(layer, ONE, seed=1))
    summary = capture.close()
    assert summary is not None and summary["captured"] == 1 and summary["skipped"] == {"multi_request": 1}
    [case] = _cases(tmp_path / "cap.zarr")
    _assert_exact(case, one, layer.indexer.topk_indices_buffer[: one.tokens])
    assert case.attrs["chunk"]["requests"] == 1


def _rank(out: str, rank: int, sizes: list[int], init: str) -> None:
    """One TP rank of a step whose prefill rows are sharded: it scores only its window, then all-gathers."""
    import vllm.distributed as dist

    torch.set_num_threads(1)
    dist._TP_RANK, dist._TP_SIZE = rank, len(sizes)
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=len(sizes))
    os.environ[serving.ENV_DIR] = out
    os.environ[serving.ENV_POLICY] = "every"
    vllm_plugin.register()
    layer = _layer()
    step = _step(layer, TWO, row_shard_sizes=sizes)
    run(layer, step)
    torch.save({"seen": step.seen[-1], "buffer": layer.indexer.topk_indices_buffer[: step.tokens].clone()},
               f"{out}.rank{rank}.pt")


@pytest.mark.slow
def test_sharded_rows_are_captured_on_every_rank_with_their_windows(tmp_path: Path) -> None:
    out, sizes = tmp_path / "cap.zarr", [13, 9]
    context = multiprocessing.get_context("fork")
    ranks = [context.Process(target=_rank, args=(str(out), r, sizes, f"file://{tmp_path}/pg"), daemon=True)
             for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join(120)
    assert [p.exitcode for p in ranks] == [0, 0]
    cases = sorted(_cases(out), key=lambda c: c.attrs["row_window"]["start"])
    assert [(c.attrs["row_window"], c.rows) for c in cases] == [
        ({"tp_rank": 0, "start": 0, "end": 13}, 13), ({"tp_rank": 1, "start": 13, "end": 22}, 9)]
    full = prefill_step(TWO, torch.zeros(64, 16), ratio=RATIO)
    for case, rows in zip(cases, (slice(0, 13), slice(13, 22)), strict=True):
        saved = torch.load(f"{out}.rank{case.attrs['tensor_parallel']['tp_rank']}.pt")
        _assert_exact(case, Step(full.metadata, None, None, 0, [saved["seen"]]),  # type: ignore[arg-type]
                      saved["buffer"][rows], rows)
        tp = case.attrs["tensor_parallel"]
        assert tp["row_sharded"] and tp["tp_size"] == 2 and tp["shard_sizes"] == sizes
        assert (case.attrs["chunk"]["token_start"], case.attrs["chunk"]["token_end"]) == (0, 22)
    # rank 0's window holds all of request A and 3 rows of B: 2 requests; rank 1's only B
    assert [c.attrs["chunk"]["requests"] for c in cases] == [2, 1]
    both = [torch.load(f"{out}.rank{r}.pt")["buffer"] for r in range(2)]
    assert torch.equal(both[0], both[1])  # after the all-gather every rank holds the whole chunk's indices
    summaries = sorted(_summaries(out), key=lambda s: s["tensor_parallel"]["tp_rank"])
    assert [s["tensor_parallel"]["row_sharded_cases"] for s in summaries] == [1, 1]
    shown = CliRunner().invoke(main, ["inspect", "--wide", str(out)])  # the layer column, with the windows
    assert shown.exit_code == 0 and "tp0 rows 0:13" in shown.output and "tp1 rows 13:22" in shown.output


def test_replicated_rows_are_captured_on_rank_0_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.distributed as dist

    monkeypatch.setattr(dist, "_TP_RANK", 1)
    monkeypatch.setattr(dist, "_TP_SIZE", 2)
    capture = _capture(tmp_path)
    layer = _layer()
    run(layer, _step(layer, TWO))  # below indexer_tp_shard_min_rows: every rank holds everything
    assert capture.close() is None and not (tmp_path / "cap.zarr").exists()
    capture.uninstall()
    explicit = _capture(tmp_path, ranks={1})
    run(layer, _step(layer, TWO))
    summary = explicit.close()
    assert summary is not None and summary["captured"] == 1
    assert summary["tensor_parallel"] == {"tp_rank": 1, "tp_size": 2, "row_sharded_cases": 0}


def test_default_policy_once_per_layer_and_width(tmp_path: Path) -> None:
    capture = _capture(tmp_path, "")
    layer = _layer()
    for seed in range(3):
        run(layer, _step(layer, TWO, seed))
    run(layer, _step(layer, ONE))
    summary = capture.close()
    assert summary is not None and summary["captured"] == 2 and summary["widths"] == {LAYER: [24, 30]}


def test_nothing_is_captured_while_a_graph_is_captured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "_capturing_graph", lambda logits: True)
    capture = _capture(tmp_path)
    layer = _layer()
    run(layer, _step(layer, TWO))
    assert capture.writer is None


def test_close_waits_a_bounded_time(tmp_path: Path) -> None:
    capture = _capture(tmp_path)
    layer = _layer()
    run(layer, _step(layer, ONE))
    assert capture.writer is not None
    with held(capture.writer):
        run(layer, _step(layer, TWO))
        started = time.monotonic()
        summary = capture.close(timeout=0.2)
        assert time.monotonic() - started < 5
    assert summary is not None and summary["unwritten"] >= 1 and "still unwritten" in summary["error"]


def test_bad_layout_disables_capture_but_not_the_kernel(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import vllm._custom_ops as ops

    capture = _capture(tmp_path)
    logits = torch.randn(4, 64)[:, :32]
    written = torch.empty(4, TOP_K, dtype=torch.int32)
    ends = torch.full((4,), 32, dtype=torch.int32)
    with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
        ops.top_k_per_row_prefill(logits, torch.zeros_like(ends), ends, written, 4, 32, 1, TOP_K)  # stride lies
    assert not capture.enabled and "do not match stride0=32" in (capture.error or "")
    assert (written >= 0).all()  # the production kernel ran
    assert len([r for r in caplog.records if "capture disabled" in r.getMessage()]) == 1


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


def test_uninstall_restores_the_originals(tmp_path: Path) -> None:
    import vllm._custom_ops as ops
    from vllm.model_executor.layers import indexer_topk

    before = (ops.top_k_per_row_prefill, torch.ops._C.top_k_per_row_prefill, indexer_topk.deep_select_topk)
    capture = _capture(tmp_path)
    assert ops.top_k_per_row_prefill is not before[0] and indexer_topk.deep_select_topk is not before[2]
    # code that inspects the op (its overloads, its schema) still sees the original's
    assert torch.ops._C.top_k_per_row_prefill.default is before[1].default
    # a module imported after install binds the wrapper by name (as sparse_mqa_logits.py does): restored too
    name = "vllm.model_executor.kernels.attention.dsa.sparse_mqa_logits"
    sys.modules.pop(name, None)
    sparse_mqa_logits = importlib.import_module(name)

    assert sparse_mqa_logits.deep_select_topk is indexer_topk.deep_select_topk is not before[2]
    capture.uninstall()
    assert (ops.top_k_per_row_prefill, torch.ops._C.top_k_per_row_prefill, indexer_topk.deep_select_topk) == before
    assert sparse_mqa_logits.deep_select_topk is before[2]


@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 6)), min_size=1, max_size=6))
def test_requests_are_counted_from_key_offsets_and_ends(requests: list[tuple[int, int]]) -> None:
    """Rows of consecutive requests as vLLM lays them out: each request's key offset, ends rising by query;
    every request holds at least one key (ke > ks), as vLLM's chunks do."""
    offsets, ends, base = [], [], 0
    for context, queries in requests:
        offsets += [base] * queries
        ends += [context + 1 + q for q in range(queries)]  # relative ends (compressed layout)
        base += context + queries
    assert count_requests(np.array(offsets), np.array(ends)) == len(requests)


def test_plugin_is_registered_and_off_without_its_variable(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["vllm.general_plugins"]["logitreplay_capture"]
    assert target == "logitreplay.capture.vllm_plugin:register"
    monkeypatch.delenv(serving.ENV_DIR, raising=False)
    vllm_plugin.register()  # a no-op: nothing imported, nothing patched
    assert serving._active is None
    monkeypatch.setenv(serving.ENV_DIR, str(tmp_path / "cap.zarr"))
    monkeypatch.setitem(sys.modules, "vllm", None)  # vLLM absent: log, never raise
    with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
        vllm_plugin.register()
    assert serving._active is None and "capture not enabled" in caplog.text


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
