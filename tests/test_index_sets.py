"""The index sets a selector returns, beyond its values being right.

`replay --determinism N` (determinism.py): reruns of every verified selector, their index sets and order
compared with the last timed call's; a selector that chooses other tied candidates, or another order, run
to run is reported with its distinct sets and first differing row.

Ties at the k-th value (ties.py): per case the tied candidates, per selector its tie policy (lowest first,
highest first, none observed), per pair the fraction of rows whose index sets agree, in the JSON and in
one table after the main one, also for selectors replayed in processes of their own."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.replay.determinism import rerun
from logitreplay.replay.ties import agreement, row_digests
from logitreplay.replay.verify import OutputBuffer

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `--selector tests.plugins:...` imports from the repository root

from tests import plugins  # noqa: E402

TIE_PLUGINS = ["make_lowest_first", "make_highest_first", "make_nondeterministic", "make_unordered"]
SPECS = [a for f in TIE_PLUGINS[:3] for a in ("--selector", f"tests.plugins:{f}")]  # all but unordered


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["replay", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def tie_archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("arch") / "ties.zarr"
    Archive.create(path).write(plugins.tie_case())
    return str(path)


def _rerun(factory: str, runs: int):  # type: ignore[no-untyped-def]
    case = plugins.tie_case()
    logits = case.padded()
    starts, ends = torch.from_numpy(case.row_starts), torch.from_numpy(case.row_ends)
    out = OutputBuffer(case.rows, case.top_k, "cpu")
    launch = getattr(plugins, factory)().prepare(logits, starts, ends, case.top_k, out.view)
    launch()
    return rerun(launch, out, runs, torch.device("cpu"))


def test_a_stable_choice_among_ties_is_deterministic() -> None:
    found = _rerun("make_lowest_first", 3)
    assert (found.runs, found.deterministic, found.distinct_sets, found.first_row) == (4, True, 1, None)


def test_other_tied_candidates_each_run_are_distinct_sets_from_the_first_tied_row() -> None:
    found = _rerun("make_nondeterministic", 3)
    assert not found.deterministic and not found.same_sets and not found.same_order
    assert found.distinct_sets == 4 and found.first_row == 0


def test_same_sets_in_another_order_is_not_deterministic_either() -> None:
    found = _rerun("make_unordered", 3)
    assert (found.deterministic, found.same_sets, found.same_order, found.distinct_sets) == (False, True, False, 1)


def test_replay_reports_determinism_per_case_and_selector(tie_archive: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    specs = [a for f in TIE_PLUGINS for a in ("--selector", f"tests.plugins:{f}")]
    res = run(tie_archive, "--selectors", "reference", *specs, "--determinism", "3", "--json", str(out))
    assert res.exit_code == 0, res.output
    results = {r["selector"]: r for r in json.loads(out.read_text())["cases"][0]["results"]}
    assert all(r["status"] == "ok" for r in results.values()), results  # every one selects the right values
    found = {name: r["determinism"] for name, r in results.items()}
    assert all(d["runs"] == 4 for d in found.values())
    assert [name for name, d in found.items() if d["deterministic"]] == ["reference", "lowest-first",
                                                                         "highest-first"]
    assert found["nondeterministic"]["distinct_sets"] == 4 and found["unordered"]["same_sets"]
    said = " ".join(res.output.split())
    assert "NONDETERMINISTIC nondeterministic on case ties: not deterministic over 4 runs: 4 distinct index " \
           "sets, first differing row 0" in said
    assert "cases: ref 1/1, lowest 1/1, highes 1/1, nondet 0/1, unorde 0/1" in said
    assert max(map(len, res.output.splitlines())) <= 80


def test_without_the_option_nothing_is_rerun(tie_archive: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert run(tie_archive, "--selectors", "reference", "--json", str(out)).exit_code == 0
    assert json.loads(out.read_text())["cases"][0]["results"][0]["determinism"] is None

def test_digests_agree_on_sets_whatever_the_order() -> None:
    a = torch.tensor([[3, 1, 2, -1], [0, 1, 2, 3]], dtype=torch.int32)
    b = torch.tensor([[2, 3, 1, -1], [0, 1, 2, 4]], dtype=torch.int32)
    assert agreement({"a": row_digests(a), "b": row_digests(b)})[0].rows == 0.5
    assert np.array_equal(row_digests(a), row_digests(a.flip(1)))


@pytest.mark.parametrize("isolate", [False, True])
def test_policies_ties_and_agreement_are_reported(tie_archive: str, tmp_path: Path, isolate: bool) -> None:
    out = tmp_path / "r.json"
    res = run(tie_archive, "--selectors", "reference", *SPECS, "--json", str(out), *(["--isolate"] if isolate else []))
    assert res.exit_code == 0, res.output
    case = json.loads(out.read_text())["cases"][0]
    longer = sum(e - s > plugins.TOP_K for s, e in plugins.BOUNDS)
    assert case["ties"]["rows_with_choice"] == case["ties"]["rows_longer"] == longer
    assert case["ties"]["tied_max"] == 32 + 15  # row 0: its first 32 values, and every other one of the last 29
    policy = {r["selector"]: r["tie_policy"] for r in case["results"]}
    assert (policy["lowest-first"], policy["highest-first"]) == ("lowest", "highest")
    assert policy["nondeterministic"] == "none observed"
    rows = {(a["a"], a["b"]): a["rows"] for a in case["agreement"]}
    assert len(rows) == 6
    short = (len(plugins.BOUNDS) - 1 - longer) / (len(plugins.BOUNDS) - 1)  # rows with no choice agree
    assert rows[("lowest-first", "highest-first")] == pytest.approx(short)
    assert "index sets: the least fraction" in " ".join(res.output.split())
    assert "policy" in res.output and "lowest  highest" in res.output


def test_no_agreement_table_when_nothing_ties(tmp_path: Path) -> None:
    path = tmp_path / "p.zarr"
    Archive.create(path).write(plugins.plugin_case())
    res = run(str(path), "--selectors", "reference", "--selector", "tests.plugins:make_good")
    assert res.exit_code == 0 and "index sets:" not in res.output


def test_the_csv_has_the_recall_determinism_tie_and_agreement_columns_of_the_json(tmp_path: Path) -> None:
    path, out, table = tmp_path / "a.zarr", tmp_path / "r.json", tmp_path / "r.csv"
    archive = Archive.create(path)
    archive.write(plugins.tie_case())
    archive.write(plugins.plugin_case("distinct"))  # distinct values: where the lossy plugin loses one
    res = run(str(path), "--selectors", "reference", *SPECS, "--selector", "tests.plugins:make_lossy",
              "--determinism", "2", "--json", str(out), "--csv", str(table))
    assert res.exit_code == 0, res.output
    cases = {c["case_id"]: c for c in json.loads(out.read_text())["cases"]}
    lines = {r["selector"]: r for r in csv.DictReader(table.open()) if r["case_id"] == "ties"}
    case = cases["ties"]
    for name, r in ((r["selector"], r) for r in case["results"]):
        line = lines[name]
        assert line["tie_policy"] == (r["tie_policy"] or "")
        assert (line["ties_rows_with_choice"], line["ties_max"]) == (str(case["ties"]["rows_with_choice"]),
                                                                   str(case["ties"]["tied_max"]))
        if r["determinism"] is not None:
            d = r["determinism"]
            assert line["deterministic"] == ("yes" if d["deterministic"] else "no")
            assert (line["determinism_runs"], line["distinct_sets"]) == (str(d["runs"]), str(d["distinct_sets"]))
            assert line["first_differing_row"] == ("" if d["first_row"] is None else str(d["first_row"]))
    assert lines["lowest-first"]["deterministic"] == "yes" and lines["nondeterministic"]["deterministic"] == "no"
    lossy = next(r for r in csv.DictReader(table.open()) if (r["case_id"], r["selector"]) == ("distinct", "lossy"))
    damage = next(r["damage"] for r in cases["distinct"]["results"] if r["selector"] == "lossy")
    assert lossy["status"] == "failed" and int(lossy["rows_affected"]) == damage["rows"]
    assert float(lossy["recall_min"]) == pytest.approx(damage["recall_min"], abs=1e-4)
    assert float(lossy["max_deficit"]) == pytest.approx(damage["max_deficit"], rel=1e-5)
    assert lines["reference"]["recall_min"] == "" and lines["reference"]["deterministic"] == "yes"
    pairs = {(a["a"], a["b"]): a["rows"] for a in case["agreement"]}
    listed = dict(p.split("=") for p in lines["lowest-first"]["agreement"].split(";"))
    assert {o: float(f) for o, f in listed.items()} == pytest.approx(
        {b if a == "lowest-first" else a: f for (a, b), f in pairs.items() if "lowest-first" in (a, b)}, abs=1e-4)
    assert float(lines["lowest-first"]["agreement_min"]) == pytest.approx(min(map(float, listed.values())), abs=1e-4)
