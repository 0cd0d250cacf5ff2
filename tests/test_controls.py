"""Controls of real cases (`replay --controls`, `synth --like`): derived cases keep everything but the
values, are reproducible from their recorded seeds, replay verified like any case, and the table puts
each real case beside its controls with real / matched per selector."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.datasets import controls
from logitreplay.replay.controls import control_rows
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult


def _case(dtype: str = "float32", seed: int = 0) -> Case:
    g = torch.Generator().manual_seed(seed)
    rows, cols = 6, 40
    logits = torch.randn(rows, cols, generator=g).to(getattr(torch, dtype))
    starts = torch.tensor([0, 3, 0, 10, 2, 0], dtype=torch.int32)
    ends = torch.tensor([40, 30, 5, 10, 39, 1], dtype=torch.int32)
    return Case.from_matrix(f"cap-{dtype}", logits, starts, ends, top_k=8, row_stride=48,
                            attrs={"model": "m", "layer_index": 3})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_controls_keep_shape_bounds_dtype_and_top_k(dtype: str) -> None:
    real = _case(dtype)
    derived = list(controls.with_controls(real, controls.parse("matched,ablate,shuffle")))
    assert [c.case_id for c in derived] == [real.case_id] + [f"{real.case_id}~{s}" for s in
                                                             ("matched", "plus100", "times1e-8", "shuffle")]
    for c in derived[1:]:
        assert (c.rows, c.cols, c.row_stride, c.top_k, c.dtype) == (real.rows, real.cols, 48, 8, dtype)
        assert np.array_equal(c.row_starts, real.row_starts) and np.array_equal(c.row_ends, real.row_ends)
        assert c.attrs["source"] == "control" and c.attrs["control_of"] == real.case_id
        assert controls.split_id(c.case_id) == (real.case_id, c.attrs["control"])
    assert controls.split_id(real.case_id) == (real.case_id, None)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ablations_are_the_cases_own_values_shifted_and_scaled_in_its_dtype(dtype: str) -> None:
    real = _case(dtype)
    x = real.torch_values().float()
    plus = controls.derive(real, "ablate+100").torch_values()
    times = controls.derive(real, "ablate*1e-8").torch_values()
    assert plus.dtype == times.dtype == real.torch_values().dtype
    assert torch.equal(plus, (x + 100).to(plus.dtype)) and torch.equal(times, (x * 1e-8).to(times.dtype))
    if dtype == "bfloat16":  # +100 in bf16 leaves few distinct values: the collapse the ablation is for
        assert plus.unique().numel() < x.unique().numel() / 2


def test_matched_and_shuffle_are_reproducible_from_their_recorded_seeds() -> None:
    real = _case()
    for name in ("matched", "shuffle"):
        a, b = controls.derive(real, name), controls.derive(real, name)
        assert np.array_equal(a.values, b.values)
        assert a.attrs["control_seed"] == controls.seed(real.case_id, name)
    other = _case(seed=1)
    other.case_id = "another-case"
    assert not np.array_equal(controls.derive(real, "matched").values, controls.derive(other, "matched").values)
    matched = controls.derive(real, "matched").values
    rng = np.random.default_rng(controls.seed(real.case_id, "matched"))
    assert np.array_equal(matched, rng.standard_normal(matched.size, dtype=np.float32))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=8), st.integers(0, 2**31))
def test_shuffle_permutes_within_each_row_only(lengths: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    cols = max(lengths) + 2
    starts = np.array([min(1, cols - n) for n in lengths], dtype=np.int32)
    ends = starts + np.array(lengths, dtype=np.int32)
    values = torch.from_numpy(rng.standard_normal(int(sum(lengths)), dtype=np.float32))
    real = Case.from_rows(f"c{seed}", values, starts, ends, top_k=3, cols=cols)
    shuffled = controls.derive(real, "shuffle")
    for r in range(real.rows):
        assert torch.equal(shuffled.row(r).sort().values, real.row(r).sort().values)


def test_unknown_controls_are_named() -> None:
    with pytest.raises(ValueError, match="unknown control 'noise'"):
        controls.parse("matched,noise")


def test_replay_controls_are_verified_and_tabled_beside_the_real_case(tmp_path: Path) -> None:
    archive = Archive.create(tmp_path / "a.zarr")
    archive.write(_case())
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "a.zarr"), "--controls", "matched,ablate,shuffle",
                                    "--selectors", "reference,native,deepselect", "--json", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    ids = [c["case_id"] for c in report["cases"]]
    assert ids == ["cap-float32"] + [f"cap-float32~{s}" for s in ("matched", "plus100", "times1e-8", "shuffle")]
    assert all(r["status"] == "ok" for c in report["cases"] for r in c["results"])  # verified, then timed
    assert "real/matched" in res.output and "matched control" in json.dumps(report["cases"][1]["source"])


def test_real_over_matched_per_selector() -> None:
    def case(cid: str, times: dict[str, float]) -> CaseResult:
        c = CaseResult(cid, 4, 40, 8, "float32", 40, "src", 160)
        c.results = [SelectorResult(s, "ok", timing=Timing([t])) for s, t in times.items()]
        return c

    result = ReplayResult("cpu", "t", TimingProtocol(), {}, "native", ["native", "deepselect"], [
        case("x", {"native": 10.0, "deepselect": 30.0}),
        case("x~matched", {"native": 20.0, "deepselect": 15.0}),
        case("x~plus100", {"native": 200.0, "deepselect": 16.0}),
        case("y", {"native": 1.0, "deepselect": 1.0}),  # no controls: not in the table
    ])
    rows = control_rows(result)
    assert [(r.case_id, r.selector) for r in rows] == [("x", "native"), ("x", "deepselect")]
    assert rows[0].real_over_matched == pytest.approx(0.5) and rows[1].real_over_matched == pytest.approx(2.0)
    assert rows[0].control_us == {"matched": 20.0, "ablate+100": 200.0}


def test_synth_like_writes_the_controls_replay_derives(tmp_path: Path) -> None:
    src = Archive.create(tmp_path / "a.zarr")
    real = _case("bfloat16")
    src.write(real)
    res = CliRunner().invoke(main, ["synth", "--like", str(tmp_path / "a.zarr"), "--controls", "matched,shuffle",
                                    "--out", str(tmp_path / "c.zarr")])
    assert res.exit_code == 0, res.output
    shared = Archive.open(tmp_path / "c.zarr")
    assert shared.case_ids() == sorted([f"{real.case_id}~matched", f"{real.case_id}~shuffle"])
    for name in ("matched", "shuffle"):
        stored = shared.read(controls.control_id(real.case_id, name))
        assert np.array_equal(stored.values, controls.derive(real, name).values)
    bad = CliRunner().invoke(main, ["synth", "--controls", "matched", "--out", str(tmp_path / "d.zarr")])
    assert bad.exit_code != 0 and "--like" in bad.output



@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_indexer_control_scores_the_cases_rows_as_an_indexer_would(dtype: str) -> None:
    real = _case(dtype)
    a, b = controls.derive(real, "indexer"), controls.derive(real, "indexer")
    assert a.case_id == f"{real.case_id}~indexer" and controls.split_id(a.case_id) == (real.case_id, "indexer")
    assert (a.rows, a.cols, a.row_stride, a.top_k, a.dtype) == (real.rows, real.cols, 48, 8, dtype)
    assert np.array_equal(a.row_starts, real.row_starts) and np.array_equal(a.row_ends, real.row_ends)
    other = _case(dtype, 1)
    other.case_id = "another-case"
    assert np.array_equal(a.values, b.values)
    assert not np.array_equal(a.values, controls.derive(other, "indexer").values)
    assert a.attrs["indexer"]["heads"] == 64 and a.attrs["control_seed"] == controls.seed(real.case_id, "indexer")
    assert controls.parse("indexer") == ("indexer",)
