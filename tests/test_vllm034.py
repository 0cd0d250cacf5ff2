"""vLLM 0.34's cooperative_topk on bfloat16 logits (selectors/upstream/vllm034.py): registered by its
declaration, refusing the 0.33 it was not read from (and 0.33's adapters refusing 0.34), and declining
what 0.34's `_cooperative_constraints` decline."""

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
    assert vllm034.VLLM_034.refuses("0.34.0") is None
    assert vllm034.VLLM_034.refuses("0.33.0") == (
        "vllm 0.33.0 is not a version this adapter knows: it was read from 0.34.0 and takes 0.34.0 <= version < 0.35.0")
    assert vllm.VLLM_033.refuses("0.34.0") is not None  # 0.33's adapters do not take an installed 0.34


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
