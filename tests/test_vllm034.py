"""vLLM 0.34's cooperative_topk on bfloat16 logits and its `auto` (selectors/upstream/vllm034.py):
registered by their declarations, refusing the 0.33 they were not read from; 0.33's cooperative and auto
refusing 0.34 while its prefill, decode, persistent and DeepSelect adapters take it (unchanged ops); and
declining what 0.34's `_cooperative_constraints` decline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.selectors.registry import available, build
from logitreplay.selectors.upstream import vllm, vllm034

CUDA = torch.device("cuda")


def _case(rows: int = 8, cols: int = 4096, k: int = 512, stride: int | None = None,
          dtype: torch.dtype = torch.bfloat16, starts: bool = False) -> Case:
    lo = np.full(rows, 3 if starts else 0, np.int32)
    ends = np.full(rows, cols, np.int32)
    values = torch.from_numpy(np.random.default_rng(rows).standard_normal(int((ends - lo).sum()))
                              .astype(np.float32)).to(dtype)
    return Case.from_rows("c", values, lo, ends, top_k=k, cols=cols, row_stride=stride)


def test_declared_is_registered_as_read_from_034() -> None:
    assert available()["vllm034-cooperative"] == f"{vllm034.__name__}:VllmCooperative034"
    assert available()["vllm034-auto"] == f"{vllm034.__name__}:VllmAuto034"
    assert vllm034.VLLM_034.refuses("0.34.0") is None
    assert vllm034.VLLM_034.refuses("0.33.0") == (
        "vllm 0.33.0 is not a version this adapter knows: it was read from 0.34.0 and takes 0.34.0 <= version < 0.35.0")


@pytest.mark.parametrize(("name", "takes_034"), [
    ("vllm-native", True), ("vllm-decode", True), ("vllm-persistent", True), ("vllm-deepselect", True),
    ("vllm-cooperative", False), ("vllm-auto", False)])
def test_033s_adapters_take_034_where_its_call_did_not_change(name: str, takes_034: bool) -> None:
    release = build(name).declared.release
    assert release.read_from == "0.33.0" and release.refuses("0.33.0") is None
    assert (release.refuses("0.34.0") is None) == takes_034
    assert release.refuses("0.35.0") is not None


def test_auto_034_chooses_with_034s_cooperative_constraints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(Case, "kind", property(lambda self: "decode"), raising=False)
    auto, auto033 = vllm034.VllmAuto034(), vllm.VllmAuto()
    assert auto.chosen(_case(), CUDA) is auto._backends["cooperative_topk"]
    assert isinstance(auto.chosen(_case(), CUDA), vllm034.VllmCooperative034)
    assert auto.chosen(_case(rows=65), CUDA).op == "persistent_topk"
    assert auto.chosen(_case(k=256, dtype=torch.float32), CUDA).op == "top_k_per_row_decode"
    # a float32 row stride of 4100 is 16-byte aligned; a bfloat16 one is not: 0.34 sends it to persistent
    assert auto.chosen(_case(stride=4096 + 4, dtype=torch.float32), CUDA).op == "cooperative_topk"
    assert auto.chosen(_case(stride=4096 + 4), CUDA).op == "persistent_topk"
    assert "vLLM 0.34 chose cooperative_topk" in auto.kernel_name(_case())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (11, 0))
    assert auto.chosen(_case(), CUDA).op == "persistent_topk"  # no cooperative on SM 11.x since 0.34
    assert auto033.chosen(_case(), CUDA).op == "cooperative_topk"  # 0.33 took SM 11.x


@pytest.mark.parametrize("case", [_case(), _case(dtype=torch.float32), _case(stride=4096 + 8), _case(k=2048, rows=64)])
def test_takes_bf16_and_fp32_within_the_cooperative_constraints(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert build("vllm034-cooperative").limits(case, CUDA) is None


@pytest.mark.parametrize(("case", "capability", "reason"), [
    (_case(stride=4096 + 4), (9, 0), "row stride 4100 is not a multiple of 8 elements"),
    (_case(stride=4096 + 4, dtype=torch.float32), (9, 0), None),  # 16 bytes are 4 float32
    (_case(rows=65), (9, 0), "65 rows: cooperative_topk takes at most 64"),
    (_case(k=256), (9, 0), "top_k 256: built for top_k in (512, 1024, 2048) only"),
    (_case(), (11, 0), "not SM 11.x or 12.x (this GPU is SM 11.x)"),
    (_case(), (8, 0), "needs SM 9.0 or newer"),
    (_case(starts=True), (9, 0), "take row lengths only"),
])
def test_declines_what_034_declines(case: Case, capability: tuple[int, int], reason: str | None,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    got = build("vllm034-cooperative").limits(case, CUDA)
    assert got is None if reason is None else reason in (got or ""), got
