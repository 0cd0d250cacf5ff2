"""The kernels' own account of their work against the CPU models': each family's work build
(-DLR_WORK_RECORD) records per row what its CPU model in cpu_models.py counts (native: histogram passes
and the last threshold bin's size; DeepSelect: compactions, candidates appended, redo, first thresholds
taken from the first round; split: rounds, parts, parts that listed their bucket), so a model that
drifts from its kernel, or a forced path (a lost bet, an overflow, a listed bucket) that did not run,
fails here by row and counter."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.datasets import synth
from logitreplay.selectors import cpu_models
from logitreplay.selectors.cuda.kernels import CudaKernel, DeepSelectCuda, NativeCuda, SplitCuda
from logitreplay.selectors.cuda.work import work_record
from tests.gpu.kernel_checks import verify_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = torch.device("cuda")
MODELS = {"native": cpu_models.native_topk, "deepselect": cpu_models.deepselect_topk,
          "split": cpu_models.split_topk}


def kernel_and_model_work(kernel: CudaKernel, case: Case) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One launch of the kernel's work build on the case, and the model's work on the same matrix (the
    same row stride, so the same configuration and alignment): counter name -> per-row counts."""
    got = work_record(kernel, case, DEVICE)
    cpu = case.padded()  # the layout work_record launched on: stride(0) the case's row stride on any device
    assert cpu.stride() == (case.row_stride, 1)
    _, work = MODELS[kernel.name](cpu, torch.from_numpy(case.row_starts), torch.from_numpy(case.row_ends), case.top_k)
    return got, {f.name: np.asarray(getattr(work, f.name)) for f in fields(work)}


def assert_same_work(kernel: CudaKernel, case: Case) -> dict[str, np.ndarray]:
    got, want = kernel_and_model_work(kernel, case)
    selecting = case.lengths > case.top_k
    for name in want:
        g, w = got[name], want[name]
        if kernel.name == "deepselect" and name == "appended":  # the kernel copies shorter rows, uncounted
            g, w = g[selecting], w[selecting]
        bad = np.flatnonzero(g != w)
        assert bad.size == 0, (f"{case.case_id}: {name} differs on rows {bad[:8].tolist()}: kernel "
                               f"{g[bad[:8]].tolist()}, model {w[bad[:8]].tolist()}")
    return got


def _on_h200_grid() -> None:
    """split's model plans for an H200's grid (cpu_models.SPLIT_GRID): 2 blocks on each SM."""
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    if 2 * sms != cpu_models.SPLIT_GRID:
        pytest.skip(f"split's model plans for {cpu_models.SPLIT_GRID} blocks; this GPU has {sms} SMs")


@pytest.mark.parametrize("kernel", [NativeCuda, DeepSelectCuda], ids=["native", "deepselect"])
@pytest.mark.parametrize("recipe", synth.recipes("stress", "small"), ids=lambda r: r.case_id)
def test_prefill_kernels_do_the_models_work(kernel: type[CudaKernel], recipe: synth.Recipe) -> None:
    assert_same_work(kernel(work=True), synth.generate(recipe))


@pytest.mark.parametrize("recipe", synth.recipes("decode", "small") + synth.recipes("decode-bf16", "small"),
                         ids=lambda r: f"{r.suite}:{r.case_id}")
def test_split_does_its_models_work_on_decode(recipe: synth.Recipe) -> None:
    _on_h200_grid()
    assert_same_work(SplitCuda(work=True), synth.generate(recipe))


def _rows(name: str, values: torch.Tensor, lengths: list[int], top_k: int, cols: int) -> Case:
    return Case.from_rows(name, values, np.zeros(len(lengths), np.int32), np.asarray(lengths, np.int32),
                          top_k=top_k, cols=cols)


@pytest.mark.parametrize("bf16", [False, True])
def test_split_lists_small_buckets_and_resolves_large_ones(bf16: bool) -> None:
    """600 rows of up to 128K: more items than blocks, so split rows' last parts list their buckets;
    values * 1e-8 (below the coarse bins' window) keep the bucket large, resolved digit by digit instead;
    rows shorter than k are copied."""
    _on_h200_grid()
    rng = np.random.default_rng(5)
    lengths = rng.integers(1000, 131072, size=600)
    lengths[::17] = rng.integers(0, 500, size=lengths[::17].shape[0])
    for scale in (1.0, 1e-8):
        values = torch.from_numpy(rng.standard_normal(int(lengths.sum())).astype(np.float32) * np.float32(scale))
        case = _rows(f"many-{scale}", values.to(torch.bfloat16) if bf16 else values, lengths.tolist(), 512, 131072)
        got = assert_same_work(SplitCuda(work=True), case)
        split_rows = got["parts"] > 1
        assert split_rows.any()
        if scale == 1.0:
            assert (got["listed"][split_rows] == got["parts"][split_rows]).any(), "no split row listed its bucket"
        else:
            assert (got["rounds"][split_rows] > 1).all(), "a large bucket was not resolved digit by digit"


@pytest.mark.parametrize(("shift", "redone"), [(50.0, 1), (-50.0, 1), (0.0, 0)], ids=["bet-lost", "overflow", "normal"])
@pytest.mark.parametrize(("cols", "top_k"), [(8192, 512), (25600, 1024), (102400, 512)], ids=["short", "k1024", "wide"])
@pytest.mark.parametrize("bf16", [False, True])
def test_deepselect_redoes_exactly_the_rows_its_model_redoes(shift: float, redone: int, cols: int, top_k: int,
                                                             bf16: bool) -> None:
    """The first round holding the row's largest values (the bet is lost) or its smallest (the free rounds
    overflow the buffer): the kernel reports the redo it made, as the model predicts, and still selects
    exactly (checks 1-5); plain rows win their bet."""
    cfg = cpu_models.deepselect_config(top_k, cols)
    x = torch.randn(2, cols, generator=torch.Generator().manual_seed(cols + bf16))
    x[0, cpu_models.deepselect_round_columns(cfg, cols, 0, 0)] += shift
    values = x.flatten()
    case = _rows(f"redo-{shift}", values.to(torch.bfloat16) if bf16 else values, [cols, cols], top_k, cols)
    got = assert_same_work(DeepSelectCuda(work=True), case)
    assert got["redone"].tolist() == [redone, 0]
    assert verify_kernel(DeepSelectCuda(), case) == []
    assert got["first_thresholds"].tolist() == [1 + redone, 1]


@pytest.mark.parametrize("case_id", ["bin-flood-c163840-b33-n1-k2048-full-f16385",
                                     "bin-flood-c163840-b256-n1-k2048-full-f40000"])
def test_deepselect_rebets_flooded_rows_as_its_model_does(case_id: str) -> None:
    """Flooded rows of 163840, k 2048: every row re-bets once in its free rounds (a compaction, no redo),
    the kernel's record equals the model's row by row, and the selection is exact."""
    case = synth.generate(next(r for r in synth.recipes("stress", "full") if r.case_id == case_id))
    got = assert_same_work(DeepSelectCuda(work=True), case)
    assert (got["redone"] == 0).all() and (got["compactions"] >= 1).all()
    assert verify_kernel(DeepSelectCuda(), case) == []


def test_deepselect_takes_no_first_threshold_from_a_short_first_round() -> None:
    """top_k 2000 on a 2100-long row: its first round holds 1844 of the row's elements, fewer than the
    threshold's rank, so the kernel takes that round whole (and selects exactly); the shortest row whose
    first round holds 2000 thresholds it."""
    top_k, cols = 2000, 2300
    cfg = cpu_models.deepselect_config(top_k, cols)
    lengths = [2100, next(c for c in range(2100, cols)
                          if len(cpu_models.deepselect_round_columns(cfg, c, 0, 0)) >= top_k)]
    values = torch.randn(sum(lengths), generator=torch.Generator().manual_seed(3))
    case = _rows("short-first-round", values, lengths, top_k, cols)
    got = assert_same_work(DeepSelectCuda(work=True), case)
    assert got["first_thresholds"].tolist() == [0, 1]
    assert verify_kernel(DeepSelectCuda(), case) == []


@pytest.mark.parametrize("dist", ["normal", "normal+100"])
def test_native_passes_follow_the_distribution(dist: str) -> None:
    """Spread values finish in the fp16 pass; values + 100 need the fp32 passes; the model says which."""
    rng = np.random.default_rng(1)
    values = torch.from_numpy(synth._distribution(dist, rng, 64 * 8192))
    got = assert_same_work(NativeCuda(work=True), _rows(dist, values, [8192] * 64, 512, 8192))
    assert (got["passes"] == 1).all() if dist == "normal" else (got["passes"] > 1).all()
