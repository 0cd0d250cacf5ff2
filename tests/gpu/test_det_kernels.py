"""The deterministic modes of the bundled kernels on a real GPU (`native-det`, `split-det`, `deepselect-det`):
each launch verified (checks 1-5), rerun under `replay --determinism`'s conditions (CUDA graph replays, and
plain launches on a second stream beside a concurrent memory-bound copy, so that atomics race otherwise)
with every output identical, and equal to the stable selection: the lowest indices among the tied
candidates, in ascending index order. On tie-heavy rows (ReLU plateaus of zeros of both signs, FP8
rounded values, a constant row: native's pass 3 and split's tie paths), ordinary rows, fp32 and bf16,
rows shorter than k and rows that start inside the matrix, k up to 4096, and the decode widths where
split cuts a row over many blocks (one wave, and more items than blocks)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.datasets import synth
from logitreplay.replay.determinism import rerun
from logitreplay.selectors.cuda.kernels import CudaKernel, DeepSelectCuda, NativeCuda, SplitCuda
from tests.gpu.kernel_checks import launched, verify_kernel
from tests.test_det_selectors import stable_selection, tie_heavy_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = torch.device("cuda")
RUNS = 5
KERNELS = {"native-det": NativeCuda, "split-det": SplitCuda, "deepselect-det": DeepSelectCuda}


def assert_deterministic_lowest_first(family: type[CudaKernel], case: Case) -> None:
    sel = family(deterministic=True)
    assert verify_kernel(sel, case) == []
    p = launched(sel, case)
    found = rerun(p.launch, p.output, RUNS, DEVICE)
    assert found.deterministic, str(found)
    want = stable_selection(p.logits.cpu(), p.row_starts.cpu(), p.row_ends.cpu(), case.top_k)
    got = p.output.view.cpu()
    differ = (got != want).any(1).nonzero().flatten()
    assert differ.numel() == 0, f"rows {differ[:5].tolist()} differ from the stable selection"


def _rows(name: str, dist: str, lengths: np.ndarray, cols: int, top_k: int, bf16: bool) -> Case:
    rng = np.random.default_rng(38)
    values = torch.from_numpy(synth._distribution(dist, rng, int(lengths.sum())))
    if dist == "relu":  # zeros of both signs
        values = values * torch.from_numpy(rng.choice(np.array([-1.0, 1.0], np.float32), values.numel()))
    if bf16:
        values = values.to(torch.bfloat16)
    return Case.from_rows(name, values, np.zeros(lengths.size, np.int32), lengths.astype(np.int32),
                          top_k=top_k, cols=cols)


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_tie_heavy_rows(kernel: str, bf16: bool) -> None:
    assert_deterministic_lowest_first(KERNELS[kernel], tie_heavy_case("ties", bf16))


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dist", ["normal", "relu", "ties"])
@pytest.mark.parametrize("top_k", [512, 2048, 4096])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_prefill_rows(kernel: str, top_k: int, dist: str, bf16: bool) -> None:
    lengths = np.random.default_rng(1).integers(0, 16384, size=64)  # some shorter than k, most wider
    assert_deterministic_lowest_first(KERNELS[kernel], _rows("prefill", dist, lengths, 16384, top_k, bf16))


@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("dist", ["normal", "relu", "ties", "low10"])
@pytest.mark.parametrize("rows, longest", [(1, 163840), (8, 163840), (600, 60000)])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_decode_widths(kernel: str, rows: int, longest: int, dist: str, bf16: bool) -> None:
    """One row over every block, a few rows in one wave of parts, and so many rows that blocks take
    several items and a split row's last part finishes its listed bucket alone."""
    lengths = np.random.default_rng(2).integers(longest // 2, longest + 1, size=rows)
    lengths[1::7] = 1000  # shorter than k (a single row keeps its length)
    assert_deterministic_lowest_first(KERNELS[kernel], _rows("decode", dist, lengths, 163840, 2048, bf16))
