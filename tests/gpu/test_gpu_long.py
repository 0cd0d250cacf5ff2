"""The bundled CUDA kernels at 2^20 columns (issue 41): checks 1-5 of docs/design.md on every case of the long
suites at full scale, on rows bounded at the 2^20th column (fp32 and bf16, a padded stride, NaN outside the
bounds), on decode rows shorter than next_n, and on launches whose rows start past 2^31 elements of the
matrix (a row offset computed in int32 would wrap there and read another row)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.datasets import synth
from tests.gpu.kernel_checks import verify_kernel
from tests.gpu.test_gpu_kernels import KERNELS, SELECTORS
from tests.test_long_suites import WIDTH, edge_case, short_decode_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

RECIPES = synth.recipes("long-decode", "full") + synth.recipes("long", "full")


def _every_kernel(case: Case, poison: float = 1e30) -> None:
    for kernel in KERNELS:
        assert verify_kernel(SELECTORS[kernel](), case, poison) == [], (kernel, case.case_id)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: f"{r.suite}:{r.case_id}")
def test_long_suite_case_verifies(recipe: synth.Recipe) -> None:
    _every_kernel(synth.generate(recipe))  # generated once, checked on every kernel (a case is up to 1 GiB)


@pytest.mark.parametrize(("dtype", "stride"), [(torch.float32, None), (torch.bfloat16, synth._deepgemm_stride(WIDTH))])
def test_bounds_at_2_20_columns(dtype: torch.dtype, stride: int | None) -> None:
    _every_kernel(edge_case(dtype, stride), poison=float("nan"))


def test_decode_rows_shorter_than_next_n_at_2_20_columns() -> None:
    _every_kernel(short_decode_case())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "stride"), [(2100, WIDTH), (600, 1 << 22)], ids=["rows", "stride"])
def test_rows_past_2_31_elements(rows: int, stride: int, dtype: torch.dtype) -> None:
    """2100 rows of 2^20 columns, or 600 rows at a 2^22 stride (8-10 GiB of fp32): the last rows start
    past element 2^31, full, one k from the end and one element long; the rows before them are empty."""
    assert (rows - 1) * stride > 2**31
    starts = np.full(rows, WIDTH, np.int32)
    ends = np.full(rows, WIDTH, np.int32)
    tail = [(0, WIDTH), (WIDTH - 2048, WIDTH), (WIDTH - 1, WIDTH), (12345, 12345 + 4096), (0, WIDTH)]
    for i, (s, e) in enumerate(tail):
        starts[rows - len(tail) + i], ends[rows - len(tail) + i] = s, e
    values = torch.from_numpy(np.random.default_rng(42).standard_normal(int((ends - starts).sum()), dtype=np.float32))
    case = Case.from_rows(f"int32-{rows}x{stride}", values.to(dtype), starts, ends, top_k=2048, cols=WIDTH,
                          row_stride=stride)
    _every_kernel(case)
