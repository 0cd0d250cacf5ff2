"""The vLLM plugin as a server runs it, inside the released vLLM 0.33.0 and 0.34.0 indexer code: steps and
their call record (the release's model runners), warm-ups, the ranks, the policy, graph capture, the
flush of a forked worker and of a SIGKILLed one, the entry point."""

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

from logitreplay.archive import Archive
from logitreplay.archive.calls import CallCount, read_calls
from logitreplay.capture import serving, vllm_plugin
from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_versions import release
from logitreplay.capture.writer import count_requests
from logitreplay.cli import main
from tests.engine_fakes.vllm import loader, prefill
from tests.engine_fakes.vllm.checks import cases, check, plugin, summary
from tests.engine_fakes.vllm.edges import Edges, fakes
from tests.engine_fakes.vllm.prefill import Request
from tests.engine_fakes.vllm.runner import RUNNERS, V1, V2, Attention, Scheduled
from tests.test_capture_sync import held, no_host_sync

LAYERS = 3
FIRST = [Request(20, 12), Request(0, 9)]  # 21 rows, two requests
SECOND = [Request(7, 6)]  # 6 rows, one request


def _scheduled(requests: list[Request], seed: int = 0, **options: Any) -> Scheduled:
    step = prefill.make_step(requests, seed)
    return Scheduled(step, prefill.metadata(step, [prefill.chunk(step, list(range(step.q.shape[0])), 0)]), options)


def _runner(module: str) -> Any:
    return importlib.import_module(module).GPUModelRunner([Attention(i) for i in range(LAYERS)])


def _serve(runner: Any, *steps: Scheduled) -> None:
    """The engine's loop: each step is execute_model, then sample_tokens."""
    for scheduled in steps:
        assert runner.execute_model(scheduled) is None
        runner.sample_tokens()


def _record(path: Path) -> Any:
    (record,) = read_calls(Archive.open(path))
    return record


@pytest.mark.parametrize(("pin", "module"), [("vllm_0330_tree", V1), ("vllm_0330_tree", V2),
                                             ("vllm_0340_tree", V2)], ids=["0.33-V1", "0.33-V2", "0.34-V2"])
def test_every_call_of_every_step_is_counted_and_warmups_are_not_steps(
        pin: str, module: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Each `execute_model` is one step, its calls counted stored or not; the runner's warm-up (V1's
    profile_run outside execute_model, V2's execute_model(dummy_run=True)) stores and records nothing.
    0.34 has no V1 runner module: its V2 runner completes the steps."""
    with plugin(request.getfixturevalue(pin), tmp_path, Edges(), "layers=0") as capture:
        runner = _runner(module)
        warm = _scheduled(SECOND, seed=5)
        runner.profile_run(warm) if module == V1 else runner._dummy_run(warm)
        _serve(runner, _scheduled(FIRST), _scheduled(SECOND, seed=1))
        if pin == "vllm_0340_tree":
            assert capture.steps.complete
        done = capture.close()
    assert done is not None and done["error"] is None
    assert done["captured"] == 2 and (done["forwards"], done["calls"]) == (2, 2 * LAYERS)
    assert done["calls_by_path"]["prefill"] == {"captured": 2, "skipped": 2 * (LAYERS - 1),
                                                "warmup": LAYERS, "not_capturable": 0}
    record = _record(tmp_path / "cap.zarr")
    assert record.engine == "vllm" and record.timer == "wall"
    assert [sorted(f.calls, key=lambda c: c.layer) for f in record.forwards] == [
        [CallCount(layer, width, rows, "float32", "prefill") for layer in range(LAYERS)]
        for width, rows in ((32, 21), (13, 6))]
    assert all(f.wall_us is not None and f.wall_us > 0 for f in record.forwards)
    for case in cases(tmp_path / "cap.zarr"):
        assert case.attrs["layer_name"] == "model.layers.0.self_attn.indexer"
        assert case.attrs["layer_named_from"] == "indexer module"


def test_a_call_outside_a_step_once_the_runner_is_wrapped_is_a_warmup(vllm_0340_tree: Path, tmp_path: Path) -> None:
    with plugin(vllm_0340_tree, tmp_path, Edges()) as capture:
        runner = _runner(V2)
        _serve(runner, _scheduled(SECOND))  # wraps the runner
        kernel_warmup = _scheduled(FIRST, seed=3)
        for layer in runner.layers:  # as vLLM's kernel warm-up does, outside execute_model
            layer.forward(kernel_warmup.step, kernel_warmup.meta)
        done = capture.close()
    assert done is not None and done["captured"] == LAYERS
    assert done["calls_by_path"]["prefill"]["warmup"] == LAYERS
    assert [f.n_calls for f in _record(tmp_path / "cap.zarr").forwards] == [LAYERS]


def test_replay_per_forward_weights_the_stored_cases_by_every_step(vllm_0340_tree: Path, tmp_path: Path) -> None:
    with plugin(vllm_0340_tree, tmp_path, Edges(), "layers=0") as capture:
        runner = _runner(V2)
        _serve(runner, _scheduled(FIRST), _scheduled(SECOND, seed=1))
        capture.close()
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "cap.zarr"), "--selectors", "reference",
                                    "--per-forward", "--json", str(out)])
    assert res.exit_code == 0, res.output
    (pf,) = json.loads(out.read_text())["per_forward"]
    assert (pf["forwards"], pf["calls"], pf["covered_calls"], pf["exact_width_calls"]) == (2, 6, 2, 2)
    assert [(u["layer"], u["width"], u["rows"], u["calls"]) for u in pf["uncovered"]] == [
        (layer, width, rows, 1) for layer in (1, 2) for width, rows in ((13, 6), (32, 21))]


@pytest.mark.parametrize("backend", ["auto", "deep_select"])
def test_the_plugin_never_syncs_the_model_thread(vllm_0340_tree: Path, tmp_path: Path, backend: str) -> None:
    """Prefill (the op's and DeepSelect's), decode and the per-step counting read no device value on the
    model's thread (the CPU watch of tests/test_capture_sync.py; the kernels' CPU models are not watched)."""
    dtype = torch.bfloat16 if backend == "deep_select" else torch.float32
    with plugin(vllm_0340_tree, tmp_path, Edges(), "every") as capture:
        runner = _runner(V2)
        _serve(runner, _scheduled(SECOND, topk_backend=backend, logits_dtype=dtype))  # opens the writer
        deadline = time.monotonic() + 60
        while capture.writer is not None and capture.writer.captured < LAYERS and time.monotonic() < deadline:
            time.sleep(0.01)
        step = prefill.make_step(FIRST, seed=2)
        decode = Scheduled(step, prefill.decode_metadata(step, 1, False), {})
        scheduled = _scheduled(FIRST, seed=1, topk_backend=backend, logits_dtype=dtype)
        with held(capture.writer), no_host_sync("cpu"):
            _serve(runner, scheduled, decode)
        done = capture.close()
    assert capture.error is None and done is not None and done["error"] is None
    assert done["captured"] == 3 * LAYERS


def test_replicated_rows_are_captured_on_rank_0_only_unless_ranks_say(vllm_0340_tree: Path, tmp_path: Path) -> None:
    with plugin(vllm_0340_tree, tmp_path / "auto", Edges(tp_rank=1, tp_size=2)) as capture:
        s = _scheduled(FIRST)
        prefill.run(s.step, s.meta)
        assert capture.close() is None and not (tmp_path / "auto" / "cap.zarr").exists()
    with plugin(vllm_0340_tree, tmp_path, Edges(tp_rank=1, tp_size=2), ranks={1}) as capture:
        s = _scheduled(FIRST)
        prefill.run(s.step, s.meta)
        done = capture.close()
    assert done is not None and done["captured"] == 1
    assert done["tensor_parallel"] == {"tp_rank": 1, "tp_size": 2, "row_sharded_cases": 0}


def test_single_request_policy_skips_the_two_request_chunk(tree: Path, tmp_path: Path) -> None:
    with plugin(tree, tmp_path, Edges(), "every,single-request") as capture:
        two, one = _scheduled(FIRST), _scheduled(SECOND, seed=1)
        prefill.run(two.step, two.meta)
        prefill.run(one.step, one.meta)
        done = capture.close()
    assert done is not None and done["captured"] == 1 and done["skipped"] == {"multi_request": 1}
    (case,) = cases(tmp_path / "cap.zarr")
    check(case, one.step, list(range(6)))


def test_default_policy_once_per_layer_and_width(tree: Path, tmp_path: Path) -> None:
    with plugin(tree, tmp_path, Edges(), "") as capture:
        for seed in range(3):
            s = _scheduled(FIRST, seed)
            prefill.run(s.step, s.meta)
        s = _scheduled(SECOND)
        prefill.run(s.step, s.meta)
        done = capture.close()
    assert done is not None and done["captured"] == 2
    assert done["widths"] == {prefill.PREFIX.format(0): [13, 32]}


def test_nothing_is_captured_while_a_graph_is_captured(vllm_0340_tree: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving, "_capturing_graph", lambda logits: True)
    with plugin(vllm_0340_tree, tmp_path, Edges()) as capture:
        s = _scheduled(FIRST)
        prefill.run(s.step, s.meta)
        assert capture.writer is None


def test_close_waits_a_bounded_time(vllm_0340_tree: Path, tmp_path: Path) -> None:
    with plugin(vllm_0340_tree, tmp_path, Edges()) as capture:
        s = _scheduled(SECOND)
        prefill.run(s.step, s.meta)
        assert capture.writer is not None
        with held(capture.writer):
            s = _scheduled(FIRST)
            prefill.run(s.step, s.meta)
            started = time.monotonic()
            done = capture.close(timeout=0.2)
            assert time.monotonic() - started < 5
    assert done is not None and done["unwritten"] >= 1 and "still unwritten" in done["error"]


def test_bad_layout_disables_capture_but_not_the_kernel(vllm_0340_tree: Path, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    with plugin(vllm_0340_tree, tmp_path, Edges()) as capture:
        import vllm._custom_ops as ops

        logits = torch.randn(4, 64)[:, :32]
        written = torch.empty(4, prefill.TOP_K, dtype=torch.int32)
        ends = torch.full((4,), 32, dtype=torch.int32)
        with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
            ops.top_k_per_row_prefill(logits, torch.zeros_like(ends), ends, written, 4, 32, 1, prefill.TOP_K)
        assert not capture.enabled and "do not match stride0=32" in (capture.error or "")
    assert (written >= 0).all()  # the production kernel ran
    assert len([r for r in caplog.records if "capture disabled" in r.getMessage()]) == 1


def test_uninstall_restores_the_originals(vllm_0340_tree: Path, tmp_path: Path) -> None:
    with loader.load(vllm_0340_tree, fakes(Edges())):
        import vllm._custom_ops as ops
        from vllm.model_executor.layers import indexer_topk, sparse_attn_indexer

        before = (ops.top_k_per_row_prefill, indexer_topk.deep_select_topk, sparse_attn_indexer.deep_select_topk,
                  sparse_attn_indexer.fused_mqa_topk_prefill)
        capture = vllm_plugin.VllmCapture(tmp_path / "cap.zarr", Policy.parse("every"))
        capture.release = release("0.34.0")
        capture.install()
        try:
            assert ops.top_k_per_row_prefill is not before[0]
            assert indexer_topk.deep_select_topk is not before[1]
            assert sparse_attn_indexer.deep_select_topk is not before[2]
            assert sparse_attn_indexer.fused_mqa_topk_prefill is not before[3]
        finally:
            capture.uninstall()
            serving._active = None
        assert (ops.top_k_per_row_prefill, indexer_topk.deep_select_topk, sparse_attn_indexer.deep_select_topk,
                sparse_attn_indexer.fused_mqa_topk_prefill) == before


def _worker(tree: str, out: str, kill: bool) -> None:
    """A vLLM worker: the plugin registered from its variables in a process running the released indexer,
    two steps captured, then the process ends as a forked multiprocessing child does (os._exit after
    multiprocessing's exit function), or is SIGKILLed."""
    torch.set_num_threads(1)
    os.environ[serving.ENV_DIR] = out
    os.environ[serving.ENV_POLICY] = "every"
    with loader.load(Path(tree), {**fakes(Edges()), **RUNNERS}):
        vllm_plugin.register()
        assert isinstance(serving._active, vllm_plugin.VllmCapture)
        for seed, requests in enumerate((FIRST, SECOND)):
            s = _scheduled(requests, seed)
            prefill.run(s.step, s.meta)
        if kill:
            deadline = time.monotonic() + 30
            while summary_count(Path(out)) != 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)


def summary_count(path: Path) -> int | None:
    found = list(path.glob("capture-summary-*.json"))
    try:
        return int(json.loads(found[0].read_text())["captured"]) if found else None
    except (ValueError, KeyError):
        return None


def _fork(*args: Any) -> int | None:
    process = multiprocessing.get_context("fork").Process(target=_worker, args=args, daemon=True)
    process.start()
    process.join(120)
    return process.exitcode


def test_forked_worker_leaves_both_cases_and_its_summary(vllm_0340_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    assert _fork(str(vllm_0340_tree), str(out), False) == 0
    found = cases(out)
    assert [c.attrs["chunk"]["requests"] for c in found] == [2, 1]
    check(found[0], prefill.make_step(FIRST, 0), list(range(21)))
    check(found[1], prefill.make_step(SECOND, 1), list(range(6)))
    a = found[0].attrs
    assert a["engine_version"] == "0.34.0" and a["index_source"] == "input of vLLM top_k_per_row_prefill"
    done = summary(out)
    assert done["final"] and done["captured"] == 2 and done["error"] is None
    result = CliRunner().invoke(main, ["replay", str(out), "--strict"])
    assert result.exit_code == 0, result.output


def test_sigkilled_worker_leaves_every_completed_case_and_a_summary(vllm_0340_tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    assert _fork(str(vllm_0340_tree), str(out), True) == -signal.SIGKILL
    assert [c.attrs["chunk"]["requests"] for c in cases(out)] == [2, 1]
    done = summary(out)
    assert done["captured"] == 2 and not done["final"]


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


def test_the_default_keeps_one_decode_call_per_layer_and_batch_bucket(vllm_0340_tree: Path, tmp_path: Path) -> None:
    """Decode matrices are all max_model_len wide: the default policy keeps a layer's first decode call of
    every power-of-two batch bucket (3 and 4 rows share one, 5 rows is the next); warm-ups store nothing."""
    with plugin(vllm_0340_tree, tmp_path, Edges(), "") as capture:
        runner = _runner(V2)
        batches = [[Request(9 + 3 * i, 1) for i in range(n)] for n in (3, 4, 5, 3)]
        steps = [prefill.make_step(b, seed=i) for i, b in enumerate(batches)]
        decodes = [Scheduled(s, prefill.decode_metadata(s, 1, False), {}) for s in steps]
        runner._dummy_run(decodes[2])
        _serve(runner, *decodes)
        done = capture.close()
    assert done is not None and done["captured"] == 2 * LAYERS
    assert done["calls_by_path"]["decode"] == {"captured": 2 * LAYERS, "skipped": 2 * LAYERS, "warmup": LAYERS,
                                               "not_capturable": 0}
    rows = sorted({c.rows for c in cases(tmp_path / "cap.zarr")})
    assert rows == [3, 5]
