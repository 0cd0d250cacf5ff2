"""Recall and damage (recall.py): how wrong a selector that fails check 3 is, in the JSON, the table and
`compare`; `--tolerate-recall` passes an approximate selector as approximate, never as exact."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.replay.recall import row_recall

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `--selector tests.plugins:...` imports from the repository root

from tests import plugins  # noqa: E402


def run(*args: str) -> Result:
    return CliRunner().invoke(main, [*args], catch_exceptions=False)


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("arch") / "plugins.zarr"
    Archive.create(path).write(plugins.plugin_case())
    return str(path)


def _lossy_figures() -> tuple[int, float]:
    """Rows longer than k (each loses its k-th value for the (k+1)-th) and the largest k-th - (k+1)-th gap."""
    case = plugins.plugin_case()
    long_rows, gap = 0, 0.0
    for r, (s, e) in enumerate(plugins.BOUNDS):
        if e - s > plugins.TOP_K:
            row = case.row(r).float().sort(descending=True).values
            long_rows += 1
            gap = max(gap, float(row[plugins.TOP_K - 1] - row[plugins.TOP_K]))
    return long_rows, gap


def test_recall_counts_values_as_a_multiset_so_ties_never_lower_it() -> None:
    expected = torch.tensor([[1.0, 2.0, 2.0], [float("-inf"), 5.0, 6.0], [float("-inf")] * 3])
    got = torch.tensor([[1.0, 1.0, 2.0], [float("-inf"), 5.0, 6.0], [float("-inf")] * 3])
    recall = row_recall(got, expected, torch.tensor([3, 2, 0]))
    assert recall.tolist() == pytest.approx([2 / 3, 1.0, 1.0])


def test_a_failing_selector_reports_recall_rows_and_deficit(archive: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = run("replay", archive, "--selectors", "reference", "--selector", "tests.plugins:make_lossy",
              "--json", str(out))
    assert res.exit_code == 0, res.output
    lossy = json.loads(out.read_text())["cases"][0]["results"][1]
    assert lossy["status"] == "failed" and lossy["failures"][0]["check"] == 3
    long_rows, gap = _lossy_figures()
    k = plugins.TOP_K
    counted = sum(e > s for s, e in plugins.BOUNDS)  # a row with nothing to select has no recall
    assert lossy["damage"] == pytest.approx({
        "recall_min": (k - 1) / k, "recall_mean": (long_rows * (k - 1) / k + counted - long_rows) / counted,
        "rows": long_rows, "of_rows": len(plugins.BOUNDS), "max_deficit": gap})
    assert "FAIL r.88" in res.output  # the narrow table's cell: the least recall of a row
    said = " ".join(res.output.split())
    assert "DAMAGE lossy on case plugins: recall min 0.8750" in said
    assert f"{long_rows} of {len(plugins.BOUNDS)} rows affected" in said


def test_tolerate_recall_passes_an_approximate_selector_as_approximate_only(archive: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = run("replay", archive, "--selectors", "reference", "--selector", "tests.plugins:make_lossy",
              "--tolerate-recall", "0.85", "--json", str(out))
    assert res.exit_code == 0, res.output
    by_name = {r["selector"]: r for r in json.loads(out.read_text())["cases"][0]["results"]}
    assert by_name["lossy"]["status"] == "approximate" and by_name["lossy"]["timing"]["median_us"] > 0
    assert by_name["lossy"]["damage"]["recall_min"] == pytest.approx(7 / 8)
    assert by_name["reference"]["status"] == "ok" and by_name["reference"]["damage"] is None
    assert "\u2248" in res.output and "approximate" in res.output and "RESULTS FAILED" not in res.output
    strict = run("replay", archive, "--selectors", "reference", "--selector", "tests.plugins:make_lossy",
                 "--tolerate-recall", "0.9", "--strict")
    assert strict.exit_code == 1 and "FAIL r.88" in strict.output


def test_compare_shows_recall_where_either_report_is_not_exact(archive: str, tmp_path: Path) -> None:
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    assert run("replay", archive, "--selectors", "reference,native", "--json", str(base)).exit_code == 0
    assert run("replay", archive, "--selectors", "reference", "--selector", "tests.plugins:make_lossy",
               "--selector", "tests.plugins:make_good", "--json", str(new)).exit_code == 0
    res = run("compare", str(base), str(new), "--json", str(tmp_path / "c.json"))
    assert res.exit_code == 0, res.output
    (change,) = json.loads((tmp_path / "c.json").read_text())["recall"]
    assert (change["selector"], change["base_status"], change["new_status"]) == ("lossy", None, "failed")
    assert change["new_recall"] == pytest.approx(7 / 8) and change["base_recall"] is None
    assert "failed 0.8750" in res.output
