"""Upstream adapters appear in the registry whatever is installed, and say why they cannot run."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Selector
from logitreplay.selectors.registry import available, build
from logitreplay.selectors.upstream import catalog

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
