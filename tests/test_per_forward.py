"""Per-forward totals: a capture of a tiny DSA model records every indexer call of every forward (stored
or not) with the forward's time, and `replay --per-forward` weights each stored case by the calls it
stands for (its layer, the nearest width), with the calls no case covers listed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive
from logitreplay.archive.calls import CallCount, read_calls
from logitreplay.capture.hooks import IndexerCapture
from logitreplay.capture.policy import Policy, PolicyState
from logitreplay.capture.writer import CaptureWriter
from logitreplay.cli import main
from tests.test_capture_hf import ScoreTopk, _saved

pytest.importorskip("transformers", minversion="5.11")

TOKENS, CHUNK = 40, 16  # three prefill chunks: widths 16, 32, 40; both layers have an indexer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _saved("deepseek_v32", tmp_path_factory)


def _capture(model_dir: Path, out: Path, *policy: str) -> dict[str, Any]:
    args = ["capture", "hf", str(model_dir), "--random-tokens", str(TOKENS), "--chunk-size", str(CHUNK),
            "--out", str(out), "--json", *[a for p in policy for a in ("--policy", p)]]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)  # type: ignore[no-any-return]


def _replay(tmp_path: Path, archive: Path) -> dict[str, Any]:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(archive), "--selectors", "reference,native", "--per-forward",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "per forward" in res.output
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_capture_records_every_call_of_every_forward(model_dir: Path, tmp_path: Path) -> None:
    summary = _capture(model_dir, tmp_path / "cap.zarr", "layers=0", "max-width=16")
    assert summary["captured"] == 1 and summary["forwards"] == 3 and summary["calls"] == 6
    (record,) = read_calls(Archive.open(tmp_path / "cap.zarr"))
    assert record.engine == "transformers" and record.timer == "wall"
    assert [f.calls for f in record.forwards] == [
        [CallCount(layer, width, rows, "float32" if layer == 0 else None, "prefill") for layer in (0, 1)]
        for width, rows in ((16, 16), (32, 16), (40, 8))]  # layer 1 was never captured: its dtype unseen
    assert all(f.wall_us is not None and f.wall_us > 0 for f in record.forwards)


def test_per_forward_totals_are_the_calls_weighted_by_their_cases(model_dir: Path, tmp_path: Path) -> None:
    _capture(model_dir, tmp_path / "cap.zarr")  # every (layer, width): each call has its own case
    report = _replay(tmp_path, tmp_path / "cap.zarr")
    (pf,) = report["per_forward"]
    assert (pf["forwards"], pf["calls"], pf["covered_calls"], pf["exact_width_calls"]) == (3, 6, 6, 6)
    assert pf["uncovered"] == [] and sorted(pf["stood_for"].values()) == [1] * 6
    (record,) = read_calls(Archive.open(tmp_path / "cap.zarr"))
    forward_us = sum(f.wall_us for f in record.forwards) / 3  # type: ignore[misc]
    assert pf["forward_us"] == pytest.approx(forward_us)
    for total in pf["totals"]:
        medians = [r["timing"]["median_us"] for c in report["cases"] for r in c["results"]
                   if r["selector"] == total["selector"]]
        assert total["topk_us_per_forward"] == pytest.approx(sum(medians) / 3)
        assert total["share_of_forward"] == pytest.approx(sum(medians) / 3 / forward_us)


def test_uncovered_layers_are_listed_and_other_widths_take_the_nearest_case(model_dir: Path,
                                                                            tmp_path: Path) -> None:
    _capture(model_dir, tmp_path / "cap.zarr", "layers=0", "max-width=16")
    report = _replay(tmp_path, tmp_path / "cap.zarr")
    (pf,) = report["per_forward"]
    assert (pf["calls"], pf["covered_calls"], pf["exact_width_calls"]) == (6, 3, 1)
    assert [(u["layer"], u["width"], u["calls"]) for u in pf["uncovered"]] == [(1, 16, 1), (1, 32, 1), (1, 40, 1)]
    ((case_id, calls),) = pf["stood_for"].items()
    assert case_id.endswith("L00-w16") and calls == 3  # the width-16 case stands for widths 16, 32 and 40
    (case,) = report["cases"]
    native = next(r for r in case["results"] if r["selector"] == "native")["timing"]["median_us"]
    total = next(t for t in pf["totals"] if t["selector"] == "native")
    assert total["topk_us_per_forward"] == pytest.approx(native * 3 / 3)


def test_archives_without_call_records_say_so(tmp_path: Path) -> None:
    assert CliRunner().invoke(main, ["synth", "--suite", "stress", "--out", str(tmp_path / "s.zarr")]).exit_code == 0
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "s.zarr"), "--case", "dist-relu*", "--selectors",
                                    "reference", "--per-forward", "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    (pf,) = json.loads((tmp_path / "r.json").read_text())["per_forward"]
    assert pf["no_records"].startswith("no call records (synthetic)") and pf["totals"] == []


def test_calls_without_a_mask_take_their_width_from_the_positions_and_one_row_is_decode(tmp_path: Path) -> None:
    model = torch.nn.ModuleDict({"scorer": ScoreTopk()})
    capture = IndexerCapture(CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("layers=5"))))
    capture.attach(model, pattern="scorer", classes=())
    keys = torch.randn(1, 10, 8)
    model["scorer"](torch.randn(1, 6, 8), keys, position_ids=torch.arange(4, 10)[None])  # not captured
    model["scorer"](torch.randn(1, 1, 8), keys, position_ids=torch.tensor([[9]]))  # a decode step
    summary = capture.close()
    assert summary["captured"] == 0 and summary["calls"] == 2
    (record,) = read_calls(Archive.open(tmp_path / "cap.zarr"))
    (forward,) = record.forwards  # no forward of the attached model ran: the calls form one group, untimed
    assert forward.wall_us is None
    assert forward.calls == [CallCount(1, 10, 6, None, "prefill"), CallCount(1, 10, 1, None, "decode")]
