"""`logitreplay merge`: the reports of separate jobs (slices of one run) merge into the report of the
whole run, case for case; reports of mixed protocols, or holding one case twice, are refused in one line;
`compare` across GPU kinds names the GPU that timed each case on each side."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.replay import ReplayConfig, run_replay, write_json
from logitreplay.replay.compare import comparable, compare
from logitreplay.replay.merge import case_gpus, differences, merge_reports
from logitreplay.replay.protocol import Timing
from logitreplay.replay.results import ReplayResult, ReportError, read_json

SELECTORS = ("reference", "tests.plugins:make_good")


def tiny_archive(path: Path, cases: int = 6) -> str:
    """Cases t0.. of growing rows and 64-192 columns, one with short rows: fast on the CPU models."""
    a = Archive.create(path)
    rng = np.random.default_rng(0)
    for i in range(cases):
        rows, cols = 4 + 4 * i, 64 * (1 + i % 3)
        ends = np.full(rows, cols, np.int32) if i % 2 else np.minimum(np.arange(rows, dtype=np.int32) + 5, cols)
        values = rng.standard_normal(int(ends.sum())).astype(np.float32)
        a.write(Case.from_rows(f"t{i}", values, np.zeros(rows, np.int32), ends, top_k=8, cols=cols,
                               attrs={"source": "test"}))
    return str(path)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_archive(tmp_path_factory.mktemp("merge") / "a.zarr")


def _job(archive: str, tmp: Path, name: str, globs: tuple[str, ...] = (), rounds: int = 1) -> Path:
    run = run_replay(ReplayConfig(locations=(archive,), selectors=SELECTORS, device="cpu", rounds=rounds,
                                  case_globs=globs))
    write_json(run.result, tmp / name)
    return tmp / name


def test_the_reports_of_slices_merge_into_the_whole_run(archive: str, tmp_path: Path) -> None:
    whole = run_replay(ReplayConfig(locations=(archive,), selectors=SELECTORS, device="cpu", rounds=1)).result
    parts = [_job(archive, tmp_path, "a.json", ("t0", "t1", "t2")), _job(archive, tmp_path, "b.json", ("t[345]",))]
    res = CliRunner().invoke(main, ["merge", *map(str, parts), "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert "6 cases from 2 reports" in res.output
    merged = read_json(tmp_path / "r.json")
    assert differences(whole, merged) == []
    assert [(r["job"], r["cases"]) for r in merged.ranks] == [(str(parts[0]), ["t0", "t1", "t2"]),
                                                              (str(parts[1]), ["t3", "t4", "t5"])]
    res = CliRunner().invoke(main, ["merge", *map(str, parts), "--out", str(tmp_path / "r.json"), "--json"])
    assert json.loads(res.stdout) == {"out": str(tmp_path / "r.json"), "cases": 6, "reports": list(map(str, parts)),
                                      "gpus": []}


def test_mixed_protocols_and_a_case_twice_are_refused_in_one_line(archive: str, tmp_path: Path) -> None:
    one = _job(archive, tmp_path, "one.json", ("t0",))
    two = _job(archive, tmp_path, "two.json", ("t1",), rounds=2)
    res = CliRunner().invoke(main, ["merge", str(one), str(two), "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1
    assert f"{one} and {two} do not merge: the timing protocols differ (rounds 1 vs 2)" in res.output
    res = CliRunner().invoke(main, ["merge", str(one), str(one), "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 1 and "case t0 is in both" in res.output
    assert not (tmp_path / "r.json").exists()
    report = read_json(one)
    other = read_json(one)
    other.selectors = ["reference"]
    with pytest.raises(ReportError, match="the selectors differ"):
        merge_reports([("x", report), ("y", other)])


def test_a_merge_keeps_the_ranks_of_a_replay_over_ranks(archive: str, tmp_path: Path) -> None:
    ranked = read_json(_job(archive, tmp_path, "r.json", ("t0", "t1")))
    ranked.ranks = [{"rank": r, "host": "n1", "device": f"cuda:{r}", "gpu": "NVIDIA H200", "cases": [f"t{r}"],
                     "lost": []} for r in (0, 1)]
    plain = read_json(_job(archive, tmp_path, "p.json", ("t2",)))
    merged = merge_reports([("r.json", ranked), ("p.json", plain)])
    assert [(r["job"], r["rank"], r["cases"]) for r in merged.ranks] == [("r.json", 0, ["t0"]), ("r.json", 1, ["t1"]),
                                                                        ("p.json", 0, ["t2"])]
    write_json(merged, tmp_path / "m.json")  # the schema holds
    assert case_gpus(read_json(tmp_path / "m.json")) == {"t0": "NVIDIA H200", "t1": "NVIDIA H200", "t2": None}


def _gpu_report(report: ReplayResult, gpu: str, scale: float) -> ReplayResult:
    """`report` as if timed on `gpu`, its times `scale` times as long."""
    out = ReplayResult.from_json(report.to_json())
    out.device, out.environment = "cuda", {**out.environment, "gpu": gpu}
    for case in out.cases:
        for r in case.results:
            if r.timing is not None:
                r.timing = Timing([t * scale for t in r.timing.samples_us] * 10, "cuda-events")
    return out


def test_compare_across_gpu_kinds_names_the_gpu_of_each_case(archive: str, tmp_path: Path) -> None:
    job = read_json(_job(archive, tmp_path, "j.json"))
    h200 = _gpu_report(job, "NVIDIA H200", 1.0)
    halves = [ReplayResult.from_json(h200.to_json()) for _ in range(2)]
    halves[0].cases, halves[1].cases = h200.cases[:3], h200.cases[3:]
    halves[1] = _gpu_report(halves[1], "NVIDIA A100", 2.0)
    mixed = merge_reports([("h.json", halves[0]), ("a.json", halves[1])])
    assert case_gpus(mixed) == {f"t{i}": "NVIDIA H200" if i < 3 else "NVIDIA A100" for i in range(6)}
    assert comparable(h200, mixed) == "BASE ran on GPU 'NVIDIA H200', NEW on 'NVIDIA A100', 'NVIDIA H200'"
    result = compare(h200, mixed)
    moved = {(r.case_id, r.base_gpu, r.new_gpu, r.flag) for r in result.rows if r.selector == "reference"}
    assert moved == {(f"t{i}", "NVIDIA H200", "NVIDIA H200" if i < 3 else "NVIDIA A100",
                      "no change" if i < 3 else "slower") for i in range(6)}
    assert any(n.startswith("across GPU kinds") for n in result.notes)
    assert json.loads(json.dumps(result.to_json()))["rows"][-1]["new_gpu"] == "NVIDIA A100"
