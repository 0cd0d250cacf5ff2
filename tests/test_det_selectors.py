"""The deterministic modes of the bundled selectors (`native-det`, `deepselect-det`, `split-det`) on CPU:
the lowest indices among the candidates tied at a row's k-th value (the index set of a stable sort), in
ascending index order, on the rows where ties are the rule in real indexer logits (ReLU plateaus of exact
zeros, -0.0 among them; FP8-rounded values), short rows and rows that start inside the matrix; and what a
replay reports of them: deterministic, tie policy "lowest", agreeing on every row with a stable selection.
tests/gpu/test_det_kernels.py holds the CUDA kernels to the same."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.selectors.registry import build

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `--selector tests.plugins:...` imports from the repository root

DET = ("native-det", "deepselect-det", "split-det")
PLAIN = ("native", "deepselect", "split")
COLS, TOP_K = 3000, 64


def tie_heavy_case(case_id: str, bf16: bool = False) -> Case:
    """Rows whose k-th value is tied among many candidates: ReLU plateaus of zeros of both signs (a few
    values above them), FP8 (e4m3) rounded values, a whole-row plateau; a row shorter than k, one of
    exactly k and one starting inside the matrix."""
    rng = np.random.default_rng(38)
    x = rng.standard_normal((8, COLS)).astype(np.float32)
    relu = np.maximum(x - 2.5, 0) * rng.choice([-1.0, 1.0], x.shape).astype(np.float32)  # -0.0 and +0.0
    fp8 = torch.from_numpy(x).to(torch.float8_e4m3fn).float().numpy()
    rows = [relu[0], relu[1], fp8[2], fp8[3], np.zeros(COLS, np.float32), relu[5], fp8[6], relu[7]]
    bounds = [(0, COLS), (0, COLS), (0, COLS), (17, COLS - 5), (0, COLS), (0, 40), (100, 100 + TOP_K), (333, 2100)]
    starts = np.array([s for s, _ in bounds], dtype=np.int32)
    ends = np.array([e for _, e in bounds], dtype=np.int32)
    values = np.concatenate([r[s:e] for r, (s, e) in zip(rows, bounds, strict=True)])
    data: np.ndarray | torch.Tensor = torch.from_numpy(values).to(torch.bfloat16) if bf16 else values
    return Case.from_rows(case_id, data, starts, ends, top_k=TOP_K, cols=COLS, attrs={"source": "test"})


def stable_selection(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, top_k: int) -> torch.Tensor:
    """What a `-det` selector must return, found independently: each row's values sorted descending by a
    stable sort (equal values keep their index order; -0.0 equals 0.0), the first k of them, in ascending
    index order, then -1."""
    out = torch.full((logits.shape[0], top_k), -1, dtype=torch.int32)
    for r in range(logits.shape[0]):
        row = logits[r, int(starts[r]):int(ends[r])].float()
        first = torch.sort(row, descending=True, stable=True).indices[:top_k]
        out[r, :first.numel()] = first.sort().values.to(torch.int32)
    return out


def run_selector(name: str, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The selector's output on the case (CPU), and the stable selection."""
    logits = case.padded()
    starts, ends = torch.from_numpy(case.row_starts), torch.from_numpy(case.row_ends)
    out = torch.full((case.rows, case.top_k), -7, dtype=torch.int32)
    build(name).prepare(logits, starts, ends, case.top_k, out)()
    return out, stable_selection(logits, starts, ends, case.top_k)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", DET)
def test_det_selectors_take_the_lowest_tied_indices_in_ascending_order(name: str, bf16: bool) -> None:
    got, want = run_selector(name, tie_heavy_case("ties", bf16))
    assert torch.equal(got, want)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    rows, cols, top_k = draw(st.integers(1, 5)), draw(st.integers(1, 400)), draw(st.integers(1, 70))
    starts = np.array([draw(st.integers(0, cols)) for _ in range(rows)], dtype=np.int32)
    ends = np.array([draw(st.integers(int(s), cols)) for s in starts], dtype=np.int32)
    total = int((ends - starts).sum())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.standard_normal(total).astype(np.float32)
    kind = draw(st.sampled_from(["normal", "halves", "zeros", "constant"]))
    x = {"normal": x, "halves": np.round(x * 2) / 2, "zeros": np.maximum(x - 1, 0) * rng.choice([-1, 1], total),
         "constant": np.full(total, 3.0)}[kind].astype(np.float32)
    values: np.ndarray | torch.Tensor = torch.from_numpy(x).to(torch.bfloat16) if draw(st.booleans()) else x
    return Case.from_rows("prop", values, starts, ends, top_k=top_k, cols=cols,
                          row_stride=cols + draw(st.sampled_from([0, 3, 64])))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_det_selectors_equal_the_stable_selection_on_any_rows(case: Case) -> None:
    for name in DET:
        got, want = run_selector(name, case)
        assert torch.equal(got, want), name


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:  # type: ignore[type-arg]
    folder = tmp_path_factory.mktemp("det")
    archive = Archive.create(folder / "ties.zarr")
    archive.write(tie_heavy_case("ties-fp32"))
    archive.write(tie_heavy_case("ties-bf16", bf16=True))
    out = folder / "r.json"
    res = CliRunner().invoke(main, ["replay", str(folder / "ties.zarr"), "--selectors",
                                    ",".join(("reference", *PLAIN, *DET)),
                                    "--selector", "tests.plugins:make_lowest_first", "--determinism", "3",
                                    "--json", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def test_a_replay_reports_them_deterministic_lowest_first_and_agreeing_with_a_stable_selection(
        report: dict) -> None:  # type: ignore[type-arg]
    for case in report["cases"]:
        assert case["ties"]["rows_with_choice"] >= 5  # the tie-heavy rows offer a choice
        results = {r["selector"]: r for r in case["results"]}
        agree = {(a["a"], a["b"]): a["rows"] for a in case["agreement"]}
        for name in DET:
            r = results[name]
            assert r["status"] == "ok", r
            assert r["determinism"]["deterministic"] and r["determinism"]["runs"] == 4
            assert r["tie_policy"] == "lowest"
            assert agree.get((name, "lowest-first"), agree.get(("lowest-first", name))) == 1.0
        for name in PLAIN:  # the default modes are reported as they are: right values, some tie policy
            r = results[name]
            assert r["status"] == "ok" and r["determinism"] is not None, r
            assert r["tie_policy"] in ("lowest", "highest", "none observed")
