"""The DeepSelect kernel on a real GPU, beyond the checks every bundled kernel gets (test_gpu_kernels.py):
every stress shape in both dtypes, each top_k class and its edges, rows around top_k, starts that are not
16-byte aligned, inputs whose order defeats a sequential scan, heavy ties and infinities, strided
outputs, and a graph replayed after the bounds change (rows whose bet is lost or whose free rounds overflow:
test_work_record.py, which also sees the redo happen). Correctness is checks 1-5 of docs/design.md: the selected
values' multiset equals torch.topk's, nothing outside the output view is written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.datasets import synth
from logitreplay.replay.verify import Failure
from logitreplay.selectors.cuda.kernels import DeepSelectCuda
from tests.gpu.kernel_checks import verify_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = torch.device("cuda")


def _verify(case: Case) -> list[Failure]:
    return verify_kernel(DeepSelectCuda(), case)


def _as_bf16(case: Case) -> Case:
    return Case.from_rows(case.case_id + "-asbf16", case.torch_values().to(torch.bfloat16), case.row_starts,
                          case.row_ends, top_k=case.top_k, cols=case.cols, row_stride=case.row_stride)


def _rows(name: str, values: np.ndarray, starts, ends, top_k: int, cols: int, stride: int | None = None,
          bf16: bool = False) -> Case:
    tv = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return Case.from_rows(name, tv.to(torch.bfloat16) if bf16 else tv, np.asarray(starts, np.int32),
                          np.asarray(ends, np.int32), top_k=top_k, cols=cols, row_stride=stride)


STRESS = synth.recipes("stress", "small")


@pytest.mark.parametrize("recipe", STRESS, ids=lambda r: r.case_id)
@pytest.mark.parametrize("dtype", ["as-recorded", "bf16"])
def test_stress_shape(recipe: synth.Recipe, dtype: str) -> None:
    case = synth.generate(recipe)
    if dtype == "bf16" and case.dtype != "bfloat16":
        case = _as_bf16(case)
    assert _verify(case) == []


@pytest.mark.parametrize("top_k", [1, 7, 256, 511, 512, 513, 1024, 1025, 2048, 2049, 4096])
@pytest.mark.parametrize("bf16", [False, True])
def test_top_k_classes_and_row_lengths_around_k(top_k: int, bf16: bool) -> None:
    """Every compile-time class (512, 1024, 2048, 4096) at and past its edges; rows of length 0, 1,
    k - 1, k, k + 1 and much longer, with starts that are not 16-byte aligned."""
    rng = np.random.default_rng(top_k)
    cols = 6 * top_k + 5000
    lengths = np.array([0, 1, top_k - 1, top_k, top_k + 1, 2 * top_k + 3, cols - 40, cols - 3])
    starts = np.array([0, 5, 3, 1, 2, 7, 37, 3])
    ends = starts + np.maximum(lengths, 0)
    values = rng.standard_normal(int((ends - starts).sum())).astype(np.float32)
    case = _rows(f"k{top_k}", values, starts, ends, top_k, cols, stride=cols + 3, bf16=bf16)
    assert _verify(case) == []


@pytest.mark.parametrize("top_k", [512, 1024, 2048, 4096])
@pytest.mark.parametrize("bf16", [False, True])
def test_few_long_rows(top_k: int, bf16: bool) -> None:
    """Rows far longer than a round (the wide configuration) next to rows of a few segments, where
    some warps have no segment at all."""
    rng = np.random.default_rng(top_k + bf16)
    cols = 300_000
    starts = np.array([0, 3, 1000, 17, 5, 0])
    lengths = np.array([cols, cols - 3, 3000, top_k + 1, 140_001, top_k - 1])
    ends = starts + lengths
    values = rng.standard_normal(int(lengths.sum())).astype(np.float32)
    case = _rows(f"long-k{top_k}", values, starts, ends, top_k, cols, stride=cols + 13, bf16=bf16)
    assert _verify(case) == []


@pytest.mark.parametrize("order", ["ascending", "descending", "constant", "two-values", "infinities"])
@pytest.mark.parametrize("bf16", [False, True])
def test_adversarial_value_orders(order: str, bf16: bool) -> None:
    """Sorted rows would let every element in under a sequential scan; the visit order must not care.
    Constant rows and +-inf make the k-th value tie with most of the row."""
    rows, cols, top_k = 16, 40000, 512
    n = rows * cols
    ramp = np.tile(np.arange(cols, dtype=np.float32), rows)
    values = {
        "ascending": ramp,
        "descending": -ramp,
        "constant": np.full(n, 3.5, np.float32),
        "two-values": np.where(np.arange(n) % 3 == 0, 1.0, -1.0).astype(np.float32),
        "infinities": np.where(np.arange(n) % 5 == 0, np.inf, -np.inf).astype(np.float32),
    }[order]
    case = _rows(order, values, np.zeros(rows), np.full(rows, cols), top_k, cols, bf16=bf16)
    assert _verify(case) == []


@pytest.mark.parametrize(("length", "pos", "nan"), [(300, 17, np.nan), (50000, 100, np.nan), (50000, 40000, -np.nan)],
                         ids=["short-row", "first-round", "after-threshold-rose"])
def test_nan_inside_a_row_is_reported(length: int, pos: int, nan: float) -> None:
    """Both signs of NaN, in a row shorter than top_k, early in a row, and deep into it."""
    top_k = 512
    values = np.random.default_rng(1).standard_normal(2 * length).astype(np.float32)
    values[length + pos] = nan
    case = _rows("nan", values, [0, 0], [length, length], top_k, length)
    logits = case.padded(device=DEVICE)
    starts, ends = (torch.from_numpy(a).to(DEVICE) for a in (case.row_starts, case.row_ends))
    out = torch.empty((case.rows, top_k), dtype=torch.int32, device=DEVICE)
    launch = DeepSelectCuda().prepare(logits, starts, ends, top_k, out)
    launch()
    assert launch.nan_seen()
    valid = out[:, : min(top_k, length)]
    assert int(valid.min()) >= 0 and int(valid.max()) < length


@pytest.mark.parametrize("dist", ["plus100", "times1e-8", "few-values"])
@pytest.mark.parametrize("top_k", [512, 2048])
@pytest.mark.parametrize("bf16", [False, True])
def test_concentrated_values_over_many_compactions(dist: str, top_k: int, bf16: bool) -> None:
    """Values packed into one first-digit bucket (normal + 100, normal * 1e-8) or onto a handful of
    distinct values: compactions must resolve the later digits, and cut ties, again and again."""
    rng = np.random.default_rng(top_k + 3 * bf16)
    rows, cols = 12, 163840
    starts = rng.integers(0, 9, rows)
    ends = np.minimum(starts + rng.integers(top_k + 1, cols - 8, rows), cols)
    x = rng.standard_normal(int((ends - starts).sum())).astype(np.float32)
    values = {"plus100": x + 100, "times1e-8": x * 1e-8, "few-values": np.round(x * 2) / 2}[dist]
    case = _rows(f"{dist}-k{top_k}", values, starts, ends, top_k, cols, stride=cols + 5, bf16=bf16)
    assert _verify(case) == []
