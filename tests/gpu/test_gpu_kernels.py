"""The bundled CUDA kernels on a real GPU: checks 1-5 of docs/design.md on every stress and control shape, fp32 and
bf16, rows shorter than top_k, non-zero starts, padded row strides, strided outputs, poisoned (even NaN)
cells outside the bounds, graph replay after a bounds change, and NaN reporting. (The layouts refused are
tests/test_kernel_limits.py's, on CPU.)"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.datasets import synth
from logitreplay.replay.verify import Failure
from logitreplay.selectors.cuda import build
from logitreplay.selectors.cuda.kernels import DeepSelectCuda, NativeCuda, SplitCuda
from tests.gpu.kernel_checks import verify_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = torch.device("cuda")
SELECTORS = {"native": NativeCuda, "deepselect": DeepSelectCuda, "split": SplitCuda}
KERNELS = [k for k in SELECTORS if k in build.kernel_names()]
RECIPES = synth.recipes("stress", "full") + synth.recipes("seed-controls", "small")


@functools.cache
def _case(recipe: synth.Recipe) -> Case:
    return synth.generate(recipe)


def _verify(kernel: str, case: Case, poison: float = 1e30) -> list[Failure]:
    return verify_kernel(SELECTORS[kernel](), case, poison)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{r.suite}:{r.case_id}")
def test_suite_case_verifies(kernel: str, recipe: synth.Recipe) -> None:
    assert _verify(kernel, _case(recipe)) == []


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("group", ["chunk", "stride", "edges"])
def test_nan_poison_outside_bounds_is_never_read(kernel: str, group: str) -> None:
    for recipe in synth.recipes("stress", "full"):
        if recipe.group == group:
            assert _verify(kernel, _case(recipe), poison=float("nan")) == []


def _random_case(rng: np.random.Generator, i: int) -> Case:
    rows = int(rng.integers(1, 300))
    cols = int(rng.integers(1, 40000))
    top_k = int(rng.integers(1, 2049))
    starts = rng.integers(0, cols + 1, size=rows)
    ends = np.minimum(cols, starts + rng.integers(0, cols + 1, size=rows))
    dist = ["normal", "normal+100", "normal*1e-8", "ties", "low10"][i % 5]
    values = synth._distribution(dist, rng, int((ends - starts).sum()))
    tv = torch.from_numpy(values)
    if i % 2:
        tv = tv.to(torch.bfloat16)
    stride = cols + int(rng.integers(0, 300))
    return Case.from_rows(f"random-{i}-{dist}", tv, starts.astype(np.int32), ends.astype(np.int32), top_k=top_k,
                          cols=cols, row_stride=stride)


@pytest.mark.parametrize("kernel", KERNELS)
def test_random_shapes_bounds_and_strides(kernel: str) -> None:
    rng = np.random.default_rng(7)
    for i in range(30):
        case = _random_case(rng, i)
        assert _verify(kernel, case) == [], case.case_id


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dist", ["normal+100", "normal*1e-8", "low10"])
def test_many_rows_and_concentrated_values(kernel: str, dist: str) -> None:
    """Past 12288 rows native finishes threshold bins by radix select instead of rank counting (as
    upstream switches to a radix sort there); concentrated values fill those bins up to 2048."""
    rng = np.random.default_rng(11)
    rows, cols = 12800, 3000
    ends = np.full(rows, cols, np.int32)
    ends[::7] = rng.integers(0, cols, size=ends[::7].shape[0])
    values = synth._distribution(dist, rng, int(ends.sum()))
    case = Case.from_rows(f"many-{dist}", values, np.zeros(rows, np.int32), ends, top_k=512, cols=cols)
    assert _verify(kernel, case) == []


@pytest.mark.parametrize("kernel", KERNELS)
def test_nan_inside_a_row_is_reported(kernel: str) -> None:
    rng = np.random.default_rng(3)
    values = rng.standard_normal(4 * 5000).astype(np.float32)
    clean = Case.from_rows("clean", values, np.zeros(4, np.int32), np.full(4, 5000, np.int32), top_k=64, cols=5000)
    values = values.copy()
    values[2 * 5000 + 17] = np.nan
    dirty = Case.from_rows("dirty", values, np.zeros(4, np.int32), np.full(4, 5000, np.int32), top_k=64, cols=5000)
    seen = []
    for case in (clean, dirty):
        logits = case.padded(device=DEVICE)
        starts, ends = (torch.from_numpy(a).to(DEVICE) for a in (case.row_starts, case.row_ends))
        out = torch.empty((case.rows, case.top_k), dtype=torch.int32, device=DEVICE)
        launch = SELECTORS[kernel]().prepare(logits, starts, ends, case.top_k, out)
        launch()
        seen.append(launch.nan_seen())
        assert int(out.min()) >= 0 and int(out.max()) < 5000  # still in range
    assert seen == [False, True]
