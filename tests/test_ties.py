"""Ties at the k-th value (ties.py): per case the tied candidates, per selector its tie policy (lowest
first, highest first, none observed), per pair the fraction of rows whose index sets agree, in the JSON
and in one table after the main one, also for selectors replayed in processes of their own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.replay.ties import agreement, row_digests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `--selector tests.plugins:...` imports from the repository root

from tests import plugins  # noqa: E402

SPECS = [a for f in ("make_lowest_first", "make_highest_first", "make_nondeterministic")
         for a in ("--selector", f"tests.plugins:{f}")]


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["replay", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def tie_archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("arch") / "ties.zarr"
    Archive.create(path).write(plugins.tie_case())
    return str(path)


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
