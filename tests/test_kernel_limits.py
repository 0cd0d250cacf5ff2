"""The kernels' limits, checked on the host and so tested without a GPU: split's 16-bit plan refuses a
launch whose rows could need more items than it indexes (instead of wrapping around silently), DeepSelect
takes its first threshold only from a first round that holds that threshold's rank of row elements, and
every family refuses a layout it cannot read with a reason (the same checks `prepare` makes on CUDA,
made here on CPU and meta tensors: shapes, strides and dtypes only)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from logitreplay.datasets import synth
from logitreplay.errors import KernelError
from logitreplay.selectors import cpu_models
from logitreplay.selectors.cuda.kernels import DeepSelectCuda, NativeCuda, SplitCuda

FAMILIES = [NativeCuda, DeepSelectCuda, SplitCuda]


def _meta(rows: int, cols: int, top_k: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """A launch's tensors with shapes and no memory: (logits, row_starts, row_ends, out)."""
    bounds = torch.empty(rows, dtype=torch.int32, device="meta")
    return (torch.empty((rows, cols), dtype=dtype, device="meta"), bounds, bounds,
            torch.empty((rows, top_k), dtype=torch.int32, device="meta"))


def _check(rows: int, cols: int, top_k: int, dtype: torch.dtype = torch.float32) -> None:
    logits, starts, ends, out = _meta(rows, cols, top_k, dtype)
    SplitCuda().check_layout(logits, starts, ends, top_k, out)


@pytest.mark.parametrize(("dtype", "cols"), [(torch.float32, 1_700_000), (torch.bfloat16, 3_300_000)])
def test_split_refuses_rows_its_plan_cannot_index(dtype: torch.dtype, cols: int) -> None:
    """1024 rows of 1.7M fp32 columns: the kernel's plan would cut them into 71680 parts, past its 16-bit
    indices (the CPU model of the plan shows it); the launch is refused with the reason instead."""
    key_bytes = torch.empty(0, dtype=dtype).element_size()
    parts = cpu_models.split_plan(np.full(1024, cols), 512, key_bytes)
    assert int(parts.sum()) > cpu_models.SPLIT_PLAN_ITEMS  # the overflow the check prevents is real
    with pytest.raises(KernelError, match=r"kernel split: 1024 rows of up to \d+ columns may be cut into \d+ parts, "
                                          r"more than the 65535 its plan indexes"):
        _check(1024, cols, 512, dtype)


@pytest.mark.parametrize(("rows", "cols"), [(1024, 1_500_000), (1025, 1_700_000), (64, 131072), (1, 10_000_000)])
def test_split_accepts_what_its_plan_indexes(rows: int, cols: int) -> None:
    """Below the limit (or past 1024 rows, where rows are not split) the same check lets the launch go."""
    _check(rows, cols, 512)
    assert int(cpu_models.split_plan(np.full(rows, cols), 512).sum()) <= max(cpu_models.SPLIT_PLAN_ITEMS, rows)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 1024), cols=st.integers(1, 3_000_000), top_k=st.sampled_from([1, 512, 2048]),
       grid=st.integers(2, 1200), bf16=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_split_parts_bound_covers_every_plan(rows: int, cols: int, top_k: int, grid: int, bf16: bool,
                                             seed: int) -> None:
    """The host's bound holds for any row lengths up to the columns on any grid: a plan's parts number at
    most the bound, or at most rows + grid (items smaller than the cache), which never reaches the limit."""
    lengths = np.random.default_rng(seed).integers(0, cols + 1, size=rows)
    parts = cpu_models.split_plan(lengths, top_k, 2 if bf16 else 4, grid)
    split_parts = int(parts[parts > 1].sum())
    assert split_parts <= max(cpu_models.split_parts_bound(rows, cols, 2 if bf16 else 4), rows + grid)


def test_the_first_round_must_hold_the_first_thresholds_rank() -> None:
    """top_k 2000 on 2100-long rows: the first round (8 segments of 256 of the row's 9) holds 1844 row
    elements when the short last segment is among them, fewer than the rank 2000 the first threshold
    asks for, so that row takes its first round whole; the shortest row whose first round holds 2000
    thresholds it. Both select exactly."""
    top_k, cols = 2000, 2100
    cfg = cpu_models.deepselect_config(top_k, cols)
    first = cpu_models.deepselect_round_columns(cfg, cols, 0, 0)
    assert len(first) == 1844 < top_k <= cfg.round - 4  # the old guard (kRound - kVec) let it through
    fits = next(c for c in range(cols, cols + 200) if len(cpu_models.deepselect_round_columns(cfg, c, 0, 0)) >= top_k)
    x = torch.randn(2, fits, generator=torch.Generator().manual_seed(2))
    idx, work = cpu_models.deepselect_topk(x, torch.zeros(2, dtype=torch.int32), torch.tensor([cols, fits],
                                           dtype=torch.int32), top_k)
    assert work.first_thresholds.tolist() == [0, 1] and work.redone.tolist() == [0, 0]
    for r, n in enumerate((cols, fits)):
        chosen = x[r, idx[r].long()].sort().values
        assert torch.equal(chosen, torch.topk(x[r, :n], top_k).values.sort().values)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_every_family_takes_the_long_suites_layouts(family: type[NativeCuda]) -> None:
    """Issue 41's shapes at 2^20 columns, fp32 and bf16, and the GPU tests' launches whose rows start past
    element 2^31 (tests/gpu/test_gpu_long.py) are within every kernel's host-side limits (split's plan
    indexes all their parts), so a GPU run of the long suites times every kernel on every case."""
    shapes = {(r.rows, r.cols, r.top_k) for s in ("long", "long-decode") for r in synth.recipes(s, "full")}
    for rows, cols, top_k in sorted(shapes | {(2100, 1 << 20, 2048), (600, 1 << 20, 2048)}):  # strides: no limit
        for dtype in (torch.float32, torch.bfloat16):
            logits, starts, ends, out = _meta(rows, cols, top_k, dtype)
            family().check_layout(logits, starts, ends, top_k, out)


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_bad_layouts_are_refused_with_a_reason(family: type[NativeCuda]) -> None:
    logits = torch.randn(4, 100)
    starts = torch.zeros(4, dtype=torch.int32)
    ends = torch.full((4,), 100, dtype=torch.int32)
    out = torch.empty((4, 8), dtype=torch.int32)
    sel = family()
    sel.check_layout(logits, starts, ends, 8, out)  # the good layout passes
    refused = [
        ((logits.half(), starts, ends, 8, out), "float32 or bfloat16"),
        ((logits, starts, ends, 8, out.long()), "out must be int32"),
        ((logits, starts, ends, 4, out), r"out must be int32 \(4, 4\)"),
        ((logits.t().contiguous().t(), starts, ends, 8, out), "unit column stride"),
        ((logits[None], starts, ends, 8, out), "2-D view"),
        ((logits, starts, ends.long(), 8, out), "row_ends must be contiguous int32"),
        ((logits, starts[:3], ends, 8, out), r"row_starts must be contiguous int32 \(4,\)"),
        ((logits, torch.zeros(8, dtype=torch.int32)[::2], ends, 8, out), "row_starts must be contiguous"),
        ((logits, starts, ends.to("meta"), 8, out), "row_ends must be contiguous int32 .* on cpu"),
        ((logits, starts, ends, 8, torch.empty((8, 4), dtype=torch.int32).t()), "unit column stride"),
    ]
    for args, reason in refused:
        with pytest.raises(KernelError, match=f"kernel {family.name}: .*{reason}"):
            sel.check_layout(*args)
    with pytest.raises(KernelError, match=f"kernel {family.name}: logits on cpu, expected a CUDA device"):
        sel.prepare(logits, starts, ends, 8, out)
