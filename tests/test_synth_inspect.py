"""Control suites are deterministic and `inspect` shows what makes a selector slow on them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.datasets import synth


def test_seed_controls_follow_the_published_shapes_and_bound_rules() -> None:
    full = {(r.group, r.distribution, r.cols, r.rows, r.top_k) for r in synth.recipes("seed-controls", "full")}
    assert ("a", "normal", 102400, 4096, 512) in full
    assert {("b", d, 8192, 8192, 512) for d in ("normal", "normal+100", "normal*1e-8")} <= full
    assert {("c", "normal", c, r, 512) for c, r in ((4096, 8192), (25600, 2048), (102400, 1310))} <= full
    assert ("d", "normal", 65536, 4096, 2048) in full
    ramp = next(r for r in synth.recipes("seed-controls", "full") if r.group == "c" and r.rows > r.cols)
    starts, ends = synth.bounds(ramp)
    i = np.arange(ramp.rows)
    assert np.array_equal(ends, np.maximum(1, (i + 1) * ramp.cols // ramp.rows)) and not starts.any()
    causal = next(r for r in synth.recipes("seed-controls", "full") if r.group == "a")
    assert np.array_equal(synth.bounds(causal)[1], causal.cols - 4096 + i[:4096] + 1)


def test_generation_is_deterministic_and_carries_its_recipe() -> None:
    r = synth.recipes("stress", "small")[0]
    a, b = synth.generate(r), synth.generate(r)
    assert a.values.tobytes() == b.values.tobytes()
    assert a.attrs["recipe"]["seed"] == r.seed and a.attrs["distribution"] == r.distribution


def test_stress_covers_edge_lengths_starts_strides_and_bf16() -> None:
    cases = list(synth.suite("stress", "small"))
    lengths = set(np.concatenate([c.lengths for c in cases]).tolist())
    k = cases[0].top_k
    assert {0, 1, k - 1, k, k + 1} <= lengths
    assert any(c.row_starts.any() for c in cases)
    assert any(c.row_stride > c.cols for c in cases)
    assert any(c.dtype == "bfloat16" for c in cases)


@pytest.mark.slow
def test_synth_then_inspect_json_shows_fp16_bin_collapse(tmp_path: Path) -> None:
    out = tmp_path / "sc.zarr"
    runner = CliRunner()
    res = runner.invoke(main, ["synth", "--suite", "seed-controls", "--scale", "small", "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["inspect", str(out), "--json"])
    assert res.exit_code == 0, res.output
    by_dist = {c["distribution"]: c for c in json.loads(res.output)["cases"] if c["case_id"].startswith("b-")}
    normal = by_dist["normal"]["values"]["fp16_bins_top_mean"]
    assert by_dist["normal+100"]["values"]["fp16_bins_top_mean"] < normal / 10
    assert by_dist["normal*1e-8"]["values"]["fp16_bins_top_mean"] < normal / 10
    assert len(Archive.open(out).case_ids()) == len(synth.recipes("seed-controls", "small"))


def test_inspect_lists_incomplete_cases_and_bad_input_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "s.zarr"
    a = Archive.create(out)
    a.write(synth.generate(synth.recipes("stress", "small")[0]))
    meta = out / "cases" / a.case_ids()[0] / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["complete"] = False
    meta.write_text(json.dumps(doc))
    runner = CliRunner()
    res = runner.invoke(main, ["inspect", str(out), "--json"])
    assert res.exit_code == 0
    assert [c["complete"] for c in json.loads(res.output)["cases"]] == [False]
    res = runner.invoke(main, ["inspect", str(tmp_path / "nothing")])
    assert res.exit_code == 1
    assert res.output.strip().startswith("Error:") and len(res.output.strip().splitlines()) == 1
