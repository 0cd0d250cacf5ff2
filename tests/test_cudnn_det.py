"""cuDNN's deterministic indexer top-k (`cudnn-indexer-topk-det`, selectors/upstream/cudnn.py): the same
class call as `cudnn-indexer-topk` with `deterministic=True`, registered by its declaration, refused on
SM120 past the widths 1.32.0's check_support takes there. The class is faked at its boundary (plan, then
`execute` into the caller's buffer): no kernel runs here."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch

from logitreplay.selectors.registry import available, build
from logitreplay.selectors.upstream import catalog, cudnn
from tests.test_peers import CUDA, _case, _run

NAMES = ("cudnn-indexer-topk", "cudnn-indexer-topk-det")


class _Plan:
    """IndexerTopK as 1.32.0's class API states it: built from sample tensors, then executed into the
    caller's int32 indices; deterministic plans take the lowest indices at the cutoff, ascending."""

    made: list[dict[str, Any]] = []

    def __init__(self, values: torch.Tensor, seq_lens: torch.Tensor, top_k: int, **options: Any) -> None:
        self.top_k, self.options = top_k, options
        _Plan.made.append(options)

    def check_support(self) -> bool:
        return True

    def compile(self) -> None:
        pass

    def scratch_workspace_bytes(self) -> int:
        return 128

    def execute(self, values: torch.Tensor, seq_lens: torch.Tensor, *, out_indices: torch.Tensor,
                workspace: torch.Tensor) -> None:
        out_indices.fill_(-1)
        for r, n in enumerate(seq_lens.tolist()):
            row = values[r, :n].float()
            keep = min(self.top_k, n)
            # a stable sort on the negated row: equal values keep their column order, lowest first
            picked = torch.sort(-row, stable=True).indices[:keep]
            # deterministic: ascending; otherwise in some other order
            picked = picked.sort().values if self.options.get("deterministic") else picked.flip(0)
            out_indices[r, :keep] = picked.to(torch.int32)


@pytest.fixture
def fake_class(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    module = types.ModuleType(cudnn.MODULE)
    module.IndexerTopK = _Plan  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, cudnn.MODULE, module)
    _Plan.made = []
    return _Plan.made


@pytest.mark.parametrize("name", NAMES)
def test_both_modes_are_registered_in_the_cudnn_family_as_read_from_1_32_0(name: str) -> None:
    assert available()[name].startswith(f"{cudnn.__name__}:")
    assert catalog.families()[name] == "cudnn"
    assert build(name).declared.release.read_from == "1.32.0"


@pytest.mark.parametrize(("name", "flag"), [("cudnn-indexer-topk", False), ("cudnn-indexer-topk-det", True)])
def test_the_plan_is_built_with_the_adapters_deterministic_flag_and_verifies(
        name: str, flag: bool, fake_class: list[dict[str, Any]]) -> None:
    assert _run(name, _case()) == ([], None)
    assert fake_class == [{"next_n": 1, "return_val": False, "deterministic": flag}]
    assert ("deterministic=True" in build(name).kernel_name(_case())) is flag


@pytest.mark.parametrize(("dtype", "fits"), [(torch.float32, 16384), (torch.bfloat16, 32768)])
def test_deterministic_mode_declines_what_sm120_refuses_and_nothing_on_sm90(
        dtype: torch.dtype, fits: int, monkeypatch: pytest.MonkeyPatch) -> None:
    det = build("cudnn-indexer-topk-det")
    wide, narrow = _case(rows=2, cols=fits + 1, dtype=dtype), _case(rows=2, cols=fits, dtype=dtype)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (12, 0))
    assert f"on SM120 takes at most {fits}" in (det.limits(wide, CUDA) or "")
    assert det.limits(narrow, CUDA) is None
    assert build("cudnn-indexer-topk").limits(wide, CUDA) is None  # the default mode has no such limit
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert det.limits(wide, CUDA) is None
