"""A selector that loses the CUDA context never takes the run down: its error is its result for that
case, and the rest of the run continues in a fresh worker (simulated on CPU: the engine is told the
context is gone after the plugin raised; the workers are real processes)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.replay import TimingProtocol, cuda_errors
from logitreplay.replay.cuda_errors import DeviceLost
from logitreplay.replay.engine import replay_case
from logitreplay.selectors.reference import ReferenceSelector
from tests import cuda_faults

CPU = torch.device("cpu")


def _case(i: int) -> Case:
    values = np.random.default_rng(i).standard_normal(4 * 32).astype(np.float32)
    return Case.from_rows(f"c{i}", values, np.zeros(4, np.int32), np.full(4, 32, np.int32), top_k=4, cols=32,
                          attrs={"source": "test"})


@pytest.fixture
def lost_after_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """In the first process it runs in, the sticky plugin raises, and the context probe then reports the
    context gone (restored here after the test)."""
    monkeypatch.setenv("LR_TEST_LOSE_ONCE", str(tmp_path / "lost"))
    monkeypatch.setattr(cuda_errors, "context_lost", cuda_errors.context_lost)


def test_an_error_with_the_context_alive_is_the_selectors_result_only() -> None:
    os.environ.pop("LR_TEST_LOSE_ONCE", None)
    result = replay_case(_case(0), [ReferenceSelector(), cuda_faults.sticky()], CPU, TimingProtocol.for_device("cpu"))
    assert [r.status for r in result.results] == ["ok", "ok"]


def test_a_lost_context_carries_the_culprits_error_out_of_the_engine(lost_after_error: None) -> None:
    with pytest.raises(DeviceLost) as info:
        replay_case(_case(0), [ReferenceSelector(), cuda_faults.sticky(), ReferenceSelector()], CPU,
                    TimingProtocol.for_device("cpu"))
    partial = info.value.partial
    assert partial is not None and partial.case_id == "c0"
    assert [(r.selector, r.status) for r in partial.results] == [("sticky", "error")]
    assert partial.results[0].reason == ("CUDA context lost: RuntimeError: CUDA error: an illegal memory access "
                                         "was encountered")


@pytest.mark.slow
def test_the_run_finishes_in_a_fresh_worker_and_strict_exits_1(tmp_path: Path, lost_after_error: None) -> None:
    path = tmp_path / "a.zarr"
    archive = Archive.create(path)
    for i in range(3):
        archive.write(_case(i))
    res = CliRunner().invoke(main, ["replay", str(path), "--selectors", "reference",
                                    "--selector", "tests.cuda_faults:sticky", "--rounds", "1", "--strict",
                                    "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 1, res.output
    assert "--strict: 1 failed, errored or invalid: c0/sticky" in res.output
    report = json.loads((tmp_path / "r.json").read_text())
    statuses = [[(r["selector"], r["status"]) for r in c["results"]] for c in report["cases"]]
    assert statuses == [[("reference", "ok"), ("sticky", "error")]] + [[("reference", "ok"), ("sticky", "ok")]] * 2
    assert any(n.startswith("sticky on case c0: CUDA context lost") and
               n.endswith("a fresh worker continued the run from there") for n in report["notes"])


@pytest.mark.timeout(180)  # before the fix the culprit's worker was started again on case 0 for ever
@pytest.mark.parametrize("isolate", [["--isolate"], []])
def test_a_selector_that_loses_the_context_on_every_case_costs_one_worker_per_case(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolate: list[str]) -> None:
    """Its error is the last result its case needed (alone in an isolated worker, or the only selector):
    the next worker starts on the next case, never on the same one again."""
    monkeypatch.setenv("LR_TEST_LOSE_ALWAYS", "1")
    monkeypatch.setattr(cuda_errors, "context_lost", cuda_errors.context_lost)
    path = tmp_path / "a.zarr"
    archive = Archive.create(path)
    for i in range(2):
        archive.write(_case(i))
    selectors = ["--selectors", "reference"] if isolate else ["--selectors", ""]
    res = CliRunner().invoke(main, ["replay", str(path), *selectors, "--selector", "tests.cuda_faults:sticky",
                                    *isolate, "--rounds", "1", "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "r.json").read_text())
    for case in report["cases"]:
        sticky = case["results"][-1]
        assert sticky["selector"] == "sticky" and sticky["status"] == "error", case
        assert sticky["reason"].startswith("CUDA context lost: "), sticky
        assert [r["status"] for r in case["results"][:-1]] == (["ok"] if isolate else []), case
    lost = [n for n in report["notes"] if n.startswith("sticky on case")]
    assert [n.split(":")[0] for n in lost] == ["sticky on case c0", "sticky on case c1"], report["notes"]
