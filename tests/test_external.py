"""Upstream adapters appear in the registry whatever is installed, and say why they cannot run."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.selectors import external
from logitreplay.selectors.base import Selector
from logitreplay.selectors.registry import available, build

CASE = Case.from_rows("c", np.zeros(8, np.float32), np.array([0, 4], np.int32), np.array([4, 8], np.int32),
                      top_k=2, cols=8)


@pytest.mark.parametrize("name", sorted(external.EXTERNAL))
def test_adapter_is_registered_and_builds(name: str) -> None:
    assert available()[name] == external.EXTERNAL[name]
    sel = build(name)
    assert isinstance(sel, Selector) and sel.name == name


@pytest.mark.parametrize("name", sorted(external.EXTERNAL))
def test_missing_package_is_named_with_its_install(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda module: None)
    sel = build(name)
    assert "needs a CUDA device" in (sel.supports(CASE, torch.device("cpu")) or "")
    assert (sel.supports(CASE, torch.device("cuda")) or "").startswith("not installed (pip install ")


def test_limits_say_what_upstream_cannot_do() -> None:
    assert "per-row length only" in (external.FlashInferRagged().limits(CASE) or "")
    assert "exactly top_k = 2048" in (external.SglFastTopk().limits(CASE) or "")
    bf16 = Case.from_rows("b", torch.zeros(8, dtype=torch.bfloat16), [0], [8], top_k=2, cols=8)
    assert "float32 logits only" in (external.FlashInferRagged().limits(bf16) or "")
    assert external.SglFastTopk().staging_bytes(CASE) == 2 * 2 * 4  # rows x top_k int32, copied into the view
