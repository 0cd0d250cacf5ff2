"""Upstream adapters appear in the registry whatever is installed, and say why they cannot run."""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Selector
from logitreplay.selectors.registry import available, build
from logitreplay.selectors.upstream import catalog
from logitreplay.selectors.upstream.deepselect import DeepSelectUpstream

CASE = Case.from_rows("c", np.zeros(8, np.float32), np.array([0, 4], np.int32), np.array([4, 8], np.int32),
                      top_k=2, cols=8)


@pytest.mark.parametrize("name", sorted(catalog.adapters()))
def test_adapter_is_registered_and_builds(name: str) -> None:
    assert available()[name] == catalog.adapters()[name].factory
    sel = build(name)
    assert isinstance(sel, Selector) and sel.name == name


@pytest.mark.parametrize("name", sorted(catalog.adapters()))
def test_missing_package_is_named_with_its_install(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda module: None)
    sel = build(name)
    assert "needs a CUDA device" in (sel.supports(CASE, torch.device("cpu")) or "")
    assert (sel.supports(CASE, torch.device("cuda")) or "").startswith("not installed (pip install ")


def test_deepselect_upstream_says_it_is_not_installed_before_any_limit() -> None:
    why = build("deepselect-upstream").supports(CASE, torch.device("cuda"))
    if importlib.util.find_spec("deep_select") is None:
        assert why == "not installed (pip install deep_select (built from DeepSeek's DeepSelect repository))"
    assert build("sgl-fast-topk").staging_bytes(CASE) == 2 * 2 * 4  # rows x top_k int32, copied into the view


def _deep_select_standin(calls: list[dict]) -> types.ModuleType:
    """`deep_select` as its interface documents it (written from those facts, no upstream code): `topk`
    fills `output_idx` (of `indices_type`, rows on a 32-byte stride) with the top `topk` absolute columns
    below each row's `end`, a row no longer than `topk` gets its `end` columns then the fill value."""
    module = types.ModuleType("deep_select")

    def topk(input: torch.Tensor, topk: int, sorted: bool = False, begin: torch.Tensor | None = None,
             end: torch.Tensor | None = None, indices_type: torch.dtype = torch.int64,
             sorted_index: bool = False,
             hint: torch.Tensor | None = None, output_idx: torch.Tensor | None = None,
             output_idx_offset: torch.Tensor | None = None, idx_oob_fill_value: int = 2**31 - 1,
             value_oob_fill_value: float = float("-inf"), return_value: bool = True,
             abort_when_nan_found: bool = True) -> tuple[None, torch.Tensor]:
        assert begin is None and hint is None and end is not None and output_idx is not None
        assert output_idx.dtype == indices_type and output_idx.stride(1) == 1
        assert (output_idx.stride(0) * output_idx.element_size()) % 32 == 0
        assert (input.stride(0) * input.element_size()) % 1024 == 0
        calls.append({"return_value": return_value, "abort": abort_when_nan_found, "sorted": sorted,
                      "fill": idx_oob_fill_value, "end_dtype": end.dtype})
        for i, e in enumerate(end.tolist()):
            if e <= topk:
                output_idx[i, :e] = torch.arange(e, dtype=indices_type)
                output_idx[i, e:] = idx_oob_fill_value
            else:
                output_idx[i] = input[i, :e].topk(topk).indices.to(indices_type)
        return None, output_idx

    module.topk = topk  # type: ignore[attr-defined]
    module.get_stride_requirement = lambda: (1024, 32)  # type: ignore[attr-defined]
    return module


def test_deepselect_upstream_launch_fills_the_view_with_row_indices_and_minus_one_tails(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []
    monkeypatch.setitem(sys.modules, "deep_select", _deep_select_standin(calls))
    logits = torch.randn(3, 1024, generator=torch.Generator().manual_seed(0))
    starts = torch.zeros(3, dtype=torch.int32)
    ends = torch.tensor([1024, 700, 5], dtype=torch.int32)
    top_k = 10  # 40 bytes a row: the adapter's own scratch rows are padded to 32-byte multiples
    out = torch.full((3, 16), -7, dtype=torch.int32)[:, :top_k]  # a strided view, as the engine's can be
    DeepSelectUpstream().prepare_case(None, logits, starts, ends, top_k, out)()
    for i, e in enumerate(ends.tolist()[:2]):
        assert set(out[i].tolist()) == set(logits[i, :e].topk(top_k).indices.tolist())
    assert out[2].tolist() == [0, 1, 2, 3, 4] + [-1] * 5
    assert calls == [{"return_value": False, "abort": False, "sorted": False, "fill": -1,
                      "end_dtype": torch.int32}]


def test_deepselect_upstream_refuses_rows_off_its_stride_or_past_column_zero(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "deep_select", _deep_select_standin([]))
    sel = DeepSelectUpstream()
    device = torch.device("cuda")

    def case(starts: list[int], stride: int) -> Case:
        values = np.zeros(sum(1000 - s for s in starts), np.float32)
        return Case.from_rows("c", values, np.array(starts, np.int32), np.full(len(starts), 1000, np.int32),
                              top_k=8, cols=1000, row_stride=stride)

    assert sel.limits(case([0, 0], 1024), device) is None
    assert "1024-byte aligned" in (sel.limits(case([0, 0], 1000), device) or "")
    assert "past column 0" in (sel.limits(case([0, 3], 1024), device) or "")
