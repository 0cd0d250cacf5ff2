"""`logitreplay compare`: ratios of medians with bootstrap 95% intervals, checked on synthetic samples with
known ratios; flags, `--fail-above`, refusal of incomparable reports, and the JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from logitreplay.cli import main
from logitreplay.replay.compare import comparable, compare
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult, write_json

GPU = {"gpu": "NVIDIA H200", "python": "3.11", "torch": "2.13.0", "numpy": "2", "platform": "linux", "cpu": "x86"}


def _report(scale: dict[str, float], seed: int, env: dict[str, Any] | None = None,
            protocol: TimingProtocol | None = None, n: int = 40) -> ReplayResult:
    """Cases c0..c4, selectors native and deepselect: samples of ~100 us with 1% noise, times `scale[sel]`."""
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(5):
        case = CaseResult(f"c{i}", 1024, 8192, 512, "float32", 8192, "normal", 1 << 25)
        case.results = [SelectorResult(s, "ok", timing=Timing(list(100.0 * (1 + i) * scale.get(s, 1.0)
                                                                  * rng.normal(1, 0.01, n)), "cuda-events"))
                        for s in ("native", "deepselect")]
        cases.append(case)
    return ReplayResult("cuda:0", "t", protocol or TimingProtocol(), {**GPU, **(env or {})}, "native",
                        ["native", "deepselect"], cases)


def test_intervals_hold_the_known_ratio_and_flag_it() -> None:
    result = compare(_report({}, 0), _report({"native": 1.10, "deepselect": 0.80}, 1))
    assert len(result.rows) == 10
    for row in result.rows:
        truth = 1.10 if row.selector == "native" else 0.80
        assert row.low < truth < row.high and row.high - row.low < 0.03
        assert row.ratio == pytest.approx(truth, rel=0.01)
        assert row.flag == ("slower" if row.selector == "native" else "faster")


def test_identical_runs_flag_no_change_and_the_bootstrap_is_deterministic() -> None:
    a, b = _report({}, 0), _report({}, 1)  # same distribution, other draws
    first, again = compare(a, b), compare(a, b)
    assert {r.flag for r in first.rows} == {"no change"}
    assert [(r.low, r.high) for r in first.rows] == [(r.low, r.high) for r in again.rows]
    assert [(r.low, r.high) for r in compare(a, b, seed=1).rows] != [(r.low, r.high) for r in first.rows]


def test_a_change_inside_the_tolerance_is_no_change() -> None:
    rows = compare(_report({}, 0), _report({"native": 1.004}, 1), tolerance=0.01).rows
    assert {r.flag for r in rows} == {"no change"}


def test_cases_in_one_report_only_are_listed() -> None:
    base, new = _report({}, 0), _report({}, 1)
    new.cases[0].results[1] = SelectorResult("deepselect", "unsupported", reason="no")
    assert compare(base, new).only_base == ["c0/deepselect"]


def test_incomparable_reports_are_named() -> None:
    base = _report({}, 0)
    assert comparable(base, _report({}, 1)) is None
    assert "NVIDIA A100" in str(comparable(base, _report({}, 1, env={"gpu": "NVIDIA A100"})))
    why = comparable(base, _report({}, 1, protocol=TimingProtocol(l2="warm")))
    assert why == "the timing protocols differ (l2 'cold' vs 'warm')"
    cpu = _report({}, 1)
    cpu.device = "cpu"
    assert "cpu" in str(comparable(base, cpu))


def _files(tmp_path: Path, new: ReplayResult) -> list[str]:
    write_json(_report({}, 0), tmp_path / "base.json")
    write_json(new, tmp_path / "new.json")
    return [str(tmp_path / "base.json"), str(tmp_path / "new.json")]


def test_fail_above_exits_1_only_when_an_interval_lies_above_it(tmp_path: Path) -> None:
    same = CliRunner().invoke(main, ["compare", *_files(tmp_path, _report({}, 1)), "--fail-above", "1.03"])
    assert same.exit_code == 0, same.output
    assert "10 no change" in same.output
    slower = CliRunner().invoke(main, ["compare", *_files(tmp_path, _report({"native": 1.10}, 1)),
                                       "--fail-above", "1.03"])
    assert slower.exit_code == 1
    assert "--fail-above 1.03: 5 ratios lie above it" in slower.output


def test_cli_refuses_other_gpus_unless_forced_and_prints_json(tmp_path: Path) -> None:
    files = _files(tmp_path, _report({}, 1, env={"gpu": "NVIDIA A100", "torch": "2.14.0"}))
    refused = CliRunner().invoke(main, ["compare", *files])
    assert refused.exit_code == 1
    assert "not comparable: BASE ran on GPU 'NVIDIA H200', NEW on 'NVIDIA A100' (--force" in refused.output
    forced = CliRunner().invoke(main, ["compare", *files, "--force", "--json"])
    assert forced.exit_code == 0, forced.output
    data = json.loads(forced.stdout)
    assert len(data["rows"]) == 10 and data["failed"] is False
    assert data["notes"][0].startswith("compared with --force although") and "torch: 2.13.0 in BASE" in data["notes"][1]


def test_a_file_that_is_not_a_report_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text('{"schema": "other"}')
    res = CliRunner().invoke(main, ["compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")])
    assert res.exit_code == 1 and "not a replay result" in res.output and len(res.output.strip().splitlines()) == 1


def test_each_case_id_stands_whole_on_a_line_of_its_own(tmp_path: Path) -> None:
    base, new = _report({}, 0), _report({}, 1)
    for case in base.cases + new.cases:  # ids as long as the stress suite's: folded, not pasted into --case
        case.case_id = f"bin-flood-{case.case_id}-c163840-b9-n1-k2048-indexer-full-f16385"
    write_json(base, tmp_path / "base.json")
    write_json(new, tmp_path / "new.json")
    result = CliRunner().invoke(main, ["compare", str(tmp_path / "base.json"), str(tmp_path / "new.json")])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert all(case.case_id in lines for case in new.cases)
    assert all(len(line) <= 80 for line in lines)
