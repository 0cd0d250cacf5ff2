"""Verification (checks 1-4 of docs/design.md) run directly: every deliberate bug is caught with its check and row,
correct selections with arbitrary tie-breaking pass, and NaN rows are found."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.replay.verify import SENTINEL, OutputBuffer, check_output, expected_values, nan_row

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def plugins() -> ModuleType:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("tests.plugins")


def _run(case: Case, selector: object, poison: float = 1e30) -> list:  # type: ignore[type-arg]
    logits = case.padded(poison=poison)
    starts, ends = torch.from_numpy(case.row_starts), torch.from_numpy(case.row_ends)
    out = OutputBuffer(case.rows, case.top_k, "cpu")
    selector.prepare(logits, starts, ends, case.top_k, out.view)()  # type: ignore[attr-defined]
    return check_output(case, logits, starts, ends, out, expected_values(logits, starts, ends, case.top_k))


def test_output_view_is_strided_inside_sentinel_buffer() -> None:
    out = OutputBuffer(3, 5, "cpu")
    assert out.view.shape == (3, 5)
    assert out.view.stride(0) > 5, "the view must not be contiguous: selectors have to honour its stride"
    assert bool((out.buffer == SENTINEL).all())


@pytest.mark.parametrize("poison", [1e30, float("nan")])
def test_good_selector_verifies(plugins: ModuleType, poison: float) -> None:
    assert _run(plugins.plugin_case(), plugins.make_good(), poison) == []


@pytest.mark.parametrize("factory", ["make_out_of_range", "make_duplicate", "make_missing_tail",
                                     "make_wrong_value", "make_write_past_view", "make_absolute"])
def test_each_bug_reports_its_check_and_row(plugins: ModuleType, factory: str) -> None:
    failures = _run(plugins.plugin_case("bugs"), getattr(plugins, factory)())
    check, row = plugins.EXPECTED[factory]
    assert failures, f"{factory} was not caught"
    first = failures[0]
    assert (first.check, first.row, first.case_id) == (check, row, "bugs"), str(first)
    assert str(first).startswith(f"check {check} (")
    assert f"row {row}" in str(first)


def test_reading_outside_bounds_is_caught_through_poison() -> None:
    """A selector that ignores the row bounds picks up the poison cells and fails check 1 or 3."""

    class Unbounded:
        name = "unbounded"

        def prepare(self, logits, starts, ends, k, out):  # type: ignore[no-untyped-def]
            return lambda: out.copy_(torch.topk(logits.float(), k, dim=1).indices - starts.unsqueeze(1))

    case = Case.from_rows("oob", np.arange(6, dtype=np.float32), np.array([2], np.int32), np.array([8], np.int32),
                          top_k=2, cols=12)
    assert {f.check for f in _run(case, Unbounded())} & {1, 3}


def test_ties_broken_differently_still_verify() -> None:
    """Any choice among equal values at the k-th place is correct, including -0.0 for 0.0."""
    values = np.array([1.0, 0.0, -0.0, 0.0, -1.0], dtype=np.float32)
    case = Case.from_rows("ties", values, np.array([0], np.int32), np.array([5], np.int32), top_k=3, cols=5)

    class PicksNegativeZero:
        name = "negzero"

        def prepare(self, logits, starts, ends, k, out):  # type: ignore[no-untyped-def]
            return lambda: out.copy_(torch.tensor([[0, 2, 1]], dtype=torch.int32))

    assert _run(case, PicksNegativeZero()) == []


def test_expected_values_of_short_and_empty_rows() -> None:
    logits = torch.tensor([[3.0, 1.0, 2.0], [5.0, 4.0, 6.0]])
    got = expected_values(logits, torch.tensor([0, 1], dtype=torch.int32), torch.tensor([1, 1], dtype=torch.int32),
                          top_k=2)
    inf = float("-inf")
    assert got.tolist() == [[inf, 3.0], [inf, inf]]


def test_nan_row_is_found(plugins: ModuleType) -> None:
    assert nan_row(plugins.plugin_case()) is None
    assert nan_row(plugins.plugin_case(nan_row=3)) == 3


def test_nan_row_skips_empty_rows() -> None:
    values = np.array([1.0, 2.0, np.nan], dtype=np.float32)
    case = Case.from_rows("nan", values, np.zeros(4, np.int32), np.array([2, 0, 0, 1], np.int32), top_k=1, cols=4)
    assert nan_row(case) == 3
