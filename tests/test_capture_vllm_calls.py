"""The vLLM plugin's call record: every indexer call of every engine step, stored or not, grouped by the
model runner's `execute_model` (tests/vllm033's V1 and V2 runners, shaped like vLLM 0.33's) and timed by
it, and `replay --per-forward` on the capture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive
from logitreplay.archive.calls import CallCount, read_calls
from logitreplay.capture import serving
from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_plugin import VllmCapture
from logitreplay.cli import main
from tests.test_capture_sync import DEVICES, held, no_host_sync
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


def _serve(runner: Any, *steps: Any) -> None:
    """The engine's loop: each step is execute_model, then sample_tokens."""
    for scheduled in steps:
        assert runner.execute_model(scheduled) is None
        runner.sample_tokens()


def _record(path: Path) -> Any:
    (record,) = read_calls(Archive.open(path))
    return record


@pytest.mark.parametrize("module", RUNNERS)
def test_every_call_of_every_step_is_counted_stored_or_not(module: str, tmp_path: Path) -> None:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("layers=0"))
    capture.install()
    runner = _runner(module)
    warm = _scheduled(runner, SECOND, seed=5)
    if hasattr(runner, "profile_run"):
        runner.profile_run(warm)  # V1's warmup: outside execute_model
    else:
        runner._dummy_run(warm)  # V2's: execute_model(dummy_run=True)
    _serve(runner, _scheduled(runner, FIRST), _scheduled(runner, SECOND, seed=1))
    summary = capture.close()
    assert summary is not None and summary["error"] is None
    assert summary["captured"] == 2 and (summary["forwards"], summary["calls"]) == (2, 2 * LAYERS)
    record = _record(tmp_path / "cap.zarr")
    assert record.engine == "vllm" and record.timer == "wall" and record.writer == capture.writer.prefix  # type: ignore[union-attr]
    assert [sorted(f.calls, key=lambda c: c.layer) for f in record.forwards] == [
        [CallCount(layer, width, rows, "float32", "prefill") for layer in range(LAYERS)]
        for width, rows in ((30, 22), (24, 16))]  # layers 1, 2 refused by the policy, counted all the same
    assert all(f.wall_us is not None and f.wall_us > 0 for f in record.forwards)
    stored = [c.case_id for c in Archive.open(tmp_path / "cap.zarr").infos()]
    assert sorted(c[-7:] for c in stored) == ["L00-w24", "L00-w30"]


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


def test_calls_outside_a_step_are_warmups_and_graph_captures_are_not_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forward outside `execute_model` once the runner is wrapped is a warm-up (vLLM's kernel warm-up,
    a compile run): it scores no request, so it must not use up the policy's keys nor count as a step."""
    from vllm.forward_context import set_forward_context

    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("every"))
    capture.install()
    runner = _runner(RUNNERS[0])
    s = _scheduled(runner, FIRST)
    with set_forward_context({layer.indexer.k_cache.prefix: s.attn_metadata for layer in runner.layers}):
        runner._model_forward(torch.zeros(s.total_num_scheduled_tokens, 8), s.index_q, s.index_weights)
    with monkeypatch.context() as m:
        m.setattr(serving, "_capturing_graph", lambda t: True)
        _serve(runner, _scheduled(runner, SECOND))  # every call under graph capture: an empty step, not recorded
    _serve(runner, _scheduled(runner, SECOND))
    summary = capture.close()
    assert summary is not None and summary["error"] is None
    (step,) = _record(tmp_path / "cap.zarr").forwards
    assert step.wall_us is not None and {(c.width, c.rows) for c in step.calls} == {(24, 16)}
    assert step.n_calls == LAYERS and summary["captured"] == LAYERS
    assert summary["calls_by_path"]["prefill"] == {"captured": LAYERS, "skipped": 0, "warmup": LAYERS,
                                                   "not_capturable": 0}


def test_replay_per_forward_weights_the_stored_cases_by_every_step(tmp_path: Path) -> None:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("layers=0"))
    capture.install()
    runner = _runner(RUNNERS[1])
    _serve(runner, _scheduled(runner, FIRST), _scheduled(runner, SECOND, seed=1))
    capture.close()
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "cap.zarr"), "--selectors", "reference",
                                    "--per-forward", "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    (pf,) = report["per_forward"]
    assert (pf["forwards"], pf["calls"], pf["covered_calls"], pf["exact_width_calls"]) == (2, 6, 2, 2)
    assert [(u["layer"], u["width"], u["rows"], u["calls"]) for u in pf["uncovered"]] == [
        (layer, width, rows, 1) for layer in (1, 2) for width, rows in ((24, 16), (30, 22))]
    record = _record(tmp_path / "cap.zarr")
    forward_us = sum(f.wall_us for f in record.forwards) / 2
    assert pf["timer"] == "wall" and pf["forward_us"] == pytest.approx(forward_us)
    (total,) = pf["totals"]
    medians = [r["timing"]["median_us"] for c in report["cases"] for r in c["results"]]
    assert total["topk_us_per_forward"] == pytest.approx(sum(medians) / 2)


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
