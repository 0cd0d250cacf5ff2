"""The split kernel on a real GPU, where its plan matters: decode shapes (few rows of a 163840-wide matrix,
each valid only to its own sequence length), one row split over every block, rows so many that blocks take
several items and items longer than the shared-memory cache, and launch after launch on one workspace
(whose cross-block counters each launch must leave zeroed for the next)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.datasets import synth
from logitreplay.replay.verify import OutputBuffer, check_output, expected_values
from logitreplay.selectors.cuda.kernels import SplitCuda
from tests.gpu.kernel_checks import verify_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = torch.device("cuda")
DECODE = synth.recipes("decode", "full") + synth.recipes("decode-bf16", "full")


def _decode_like(rows: int, lengths: np.ndarray, dist: str, bf16: bool, top_k: int, seed: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    values = torch.from_numpy(synth._distribution(dist, rng, int(lengths.sum())))
    if bf16:
        values = values.to(torch.bfloat16)
    return Case.from_rows(f"split-{rows}-{dist}", values, np.zeros(rows, np.int32), lengths.astype(np.int32),
                          top_k=top_k, cols=163840)


@pytest.mark.parametrize("recipe", DECODE, ids=lambda r: f"{r.suite}:{r.case_id}")
def test_decode_suite_verifies(recipe: synth.Recipe) -> None:
    assert verify_kernel(SplitCuda(), synth.generate(recipe)) == []


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("dist", ["normal", "normal+100", "ties", "low10"])
def test_one_full_row_split_over_every_block(dist: str, bf16: bool) -> None:
    case = _decode_like(1, np.array([163840]), dist, bf16, 2048)
    assert verify_kernel(SplitCuda(), case) == []


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("rows, longest", [(600, 131072), (1200, 60000)])
def test_many_long_rows(rows: int, longest: int, bf16: bool) -> None:
    """600 rows of up to 128K are split into more items than the grid has blocks, so blocks take items
    of several rows in turn; past 1024 rows every row is one item, longer than the shared-memory key
    cache, whose rest is re-read."""
    rng = np.random.default_rng(5)
    lengths = rng.integers(1000, longest, size=rows)
    lengths[::17] = rng.integers(0, 600, size=lengths[::17].shape[0])  # some rows shorter than k
    assert verify_kernel(SplitCuda(), _decode_like(rows, lengths, "normal", bf16, 512)) == []


def test_launch_after_launch_on_one_workspace() -> None:
    """Twenty launches with new row lengths each time, on one prepared launch (one workspace): every
    output is exact, so no launch left counters or histograms behind."""
    rng = np.random.default_rng(9)
    rows, cols, top_k = 16, 163840, 2048
    logits = torch.randn(rows, cols, device=DEVICE)
    starts = torch.zeros(rows, dtype=torch.int32, device=DEVICE)
    ends = torch.full((rows,), cols, dtype=torch.int32, device=DEVICE)
    out = OutputBuffer(rows, top_k, DEVICE)
    launch = SplitCuda().prepare(logits, starts, ends, top_k, out.view)
    for i in range(20):
        ends.copy_(torch.from_numpy(rng.integers(0, cols + 1, size=rows).astype(np.int32)))
        launch()
        torch.cuda.synchronize()
        lens = ends.cpu().numpy()
        valid = torch.cat([logits[r, : lens[r]].cpu() for r in range(rows)])
        case = Case.from_rows(f"launch-{i}", valid, np.zeros(rows, np.int32), lens, top_k=top_k, cols=cols)
        assert check_output(case, logits, starts, ends, out, expected_values(logits, starts, ends, top_k)) == [], i
