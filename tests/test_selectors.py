"""The reference selector and the CPU models of native, DeepSelect and split meet the selection semantics on
any shape, bounds, k, dtype and value distribution (hypothesis), and the models' work counters show
what the algorithms are known to do."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logitreplay.archive import Case
from logitreplay.replay.engine import replay_case
from logitreplay.replay.protocol import TimingProtocol
from logitreplay.selectors import cpu_models as models
from logitreplay.selectors.registry import build

SELECTORS = ("reference", "native", "deepselect", "split")
ONCE = TimingProtocol(warmup=0, rounds=1, samples_per_round=1, l2="warm", timer="wall", graphs=False)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    rows = draw(st.integers(1, 6))
    cols = draw(st.integers(1, 300))
    top_k = draw(st.integers(1, 80))
    starts = np.array([draw(st.integers(0, cols)) for _ in range(rows)], dtype=np.int32)
    ends = np.array([draw(st.integers(int(s), cols)) for s in starts], dtype=np.int32)
    total = int((ends - starts).sum())
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kind = draw(st.sampled_from(["normal", "ties", "zeros", "shifted", "tiny"]))
    x = rng.standard_normal(total).astype(np.float32)
    x = {"normal": x, "ties": np.round(x * 2) / 2, "zeros": np.maximum(x - 1, 0) * rng.choice([-1, 1], total),
         "shifted": x + 100, "tiny": x * 1e-8}[kind].astype(np.float32)
    values: np.ndarray | torch.Tensor = x
    if draw(st.booleans()):
        values = torch.from_numpy(x).to(torch.bfloat16)
    stride = cols + draw(st.sampled_from([0, 0, 3, 64]))
    return Case.from_rows("prop", values, starts, ends, top_k=top_k, cols=cols, row_stride=stride)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), poison=st.sampled_from([1e30, float("nan")]))
@pytest.mark.slow
def test_every_builtin_verifies(case: Case, poison: float) -> None:
    result = replay_case(case, [build(n) for n in SELECTORS], torch.device("cpu"), ONCE, poison=poison)
    for res in result.results:
        assert res.status == "ok", f"{res.selector}: {res.reason} {[str(f) for f in res.failures]}"
        assert res.timing is not None and len(res.timing.samples_us) == 1


def _rows(values: np.ndarray, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(values.reshape(rows, cols))
    return x, torch.zeros(rows, dtype=torch.int32), torch.full((rows,), cols, dtype=torch.int32)


@pytest.mark.parametrize("transform", ["+100", "*1e-8"])
def test_native_needs_extra_passes_on_concentrated_values(transform: str) -> None:
    """Values squeezed into few fp16 bins leave the first threshold bin too big to sort: more passes."""
    x = np.random.default_rng(1).standard_normal(8 * 8192).astype(np.float32)
    y = x + np.float32(100) if transform == "+100" else x * np.float32(1e-8)
    _, normal = models.native_topk(*_rows(x, 8, 8192), 512)
    _, squeezed = models.native_topk(*_rows(y, 8, 8192), 512)
    assert normal.passes.max() == 1
    assert squeezed.passes.min() >= 2
    assert squeezed.final_sort.max() <= models.NATIVE_FINAL_ITEMS


def test_native_uses_all_four_passes_when_only_low_bits_differ() -> None:
    bits = np.uint32(0x3F800000) | np.random.default_rng(2).integers(0, 1 << 10, 4 * 4096, dtype=np.uint32)
    idx, work = models.native_topk(*_rows(bits.view(np.float32), 4, 4096), 256)
    assert work.passes.tolist() == [4, 4, 4, 4]
    assert bool((idx >= 0).all())


def test_native_copies_rows_not_longer_than_k() -> None:
    _, work = models.native_topk(torch.randn(2, 10), torch.tensor([0, 0], dtype=torch.int32),
                                 torch.tensor([4, 10], dtype=torch.int32), 10)
    assert work.passes.tolist() == [0, 0]


def test_deepselect_thresholds_a_long_row_from_its_first_round() -> None:
    """A short row is taken whole; a long row gets its threshold from its first round (the bet of
    keep_rank), after which the rest of the row adds few candidates and no compaction is needed."""
    x = torch.randn(3, 20000, generator=torch.Generator().manual_seed(4))
    _, work = models.deepselect_topk(x, torch.zeros(3, dtype=torch.int32), torch.tensor([100, 5000, 20000],
                                     dtype=torch.int32), 64)
    assert work.compactions[0] == 0 and work.appended[0] == 100  # short row: everything is a candidate
    assert work.compactions.tolist() == [0, 0, 0] and work.redone.tolist() == [0, 0, 0]
    assert work.appended[2] < 20000 // 20, "the first round's threshold rejects most of a long row"


def test_deepselect_work_barely_depends_on_distribution() -> None:
    """The point of DeepSelect: the same shape costs about the same whatever the values."""
    x = np.random.default_rng(3).standard_normal(4 * 16384).astype(np.float32)
    works = [models.deepselect_topk(*_rows(v, 4, 16384), 512)[1] for v in (x, x + 100, x * np.float32(1e-8))]
    assert len({int(w.compactions.sum()) for w in works}) == 1
    assert max(int(w.appended.sum()) for w in works) <= 1.02 * min(int(w.appended.sum()) for w in works)
    assert not any(w.redone.any() for w in works)


@pytest.mark.parametrize("shift", [50.0, -50.0], ids=["bet-lost", "buffer-overflows"])
def test_deepselect_redoes_a_row_whose_first_round_misleads(shift: float) -> None:
    """Row 0's first visited round holds its largest values (the threshold set from it is above the
    row's k-th value) or its smallest (the rest of the row floods the buffer): that row is redone
    exactly and still selects the top k; row 1, plain normal values, is not."""
    cols, top_k = 30000, 512
    x = torch.randn(2, cols, generator=torch.Generator().manual_seed(5))
    x[0, models.deepselect_round_columns(models.deepselect_config(top_k, cols), cols, 0, 0)] += shift
    idx, work = models.deepselect_topk(x, torch.zeros(2, dtype=torch.int32), torch.full((2,), cols,
                                       dtype=torch.int32), top_k)
    assert work.redone.tolist() == [1, 0]
    chosen = x.gather(1, idx.long()).sort(dim=1).values
    assert torch.equal(chosen, torch.topk(x, top_k, dim=1).values.sort(dim=1).values)


FLOODED = "bin-flood-c163840-b33-n1-k2048-full-f16385"  # stress: one such row overflowed before the re-bet


def test_deepselect_rebets_flooded_rows_instead_of_redoing_them() -> None:
    """33 rows of 163840, k 2048, 16385 values in one coarse bin: the first round's bet lets in about 3%
    of a row, on course for the whole buffer (6144), and one row of the 33 (the whole launch's time)
    used to overflow and be read again. The re-bet after an eighth of the rounds cuts every row back
    once, and none is redone."""
    from logitreplay.datasets import synth
    case = synth.generate(next(r for r in synth.recipes("stress", "full") if r.case_id == FLOODED))
    idx, work = models.deepselect_topk(case.padded(), torch.from_numpy(case.row_starts),
                                       torch.from_numpy(case.row_ends), case.top_k)
    assert work.redone.tolist() == [0] * case.rows
    assert work.compactions.tolist() == [1] * case.rows
    assert int(work.appended.max()) < models.deepselect_config(case.top_k, case.cols).cap * 3 // 4
    chosen = case.padded().gather(1, idx.long()).sort(dim=1).values
    assert torch.equal(chosen, torch.topk(case.padded(), case.top_k, dim=1).values.sort(dim=1).values)


def test_deepselect_rebets_only_where_a_row_can_be_long_enough() -> None:
    """The narrow variant of a class with a wide one serves rows shorter than the wide stride: fewer
    rounds than a re-bet needs, so it has none (the kernel compiles it without, for the free rounds'
    registers); the wide variants and the classes without one re-bet."""
    narrow, wide = models.deepselect_config(512, models.DS_WIDE_STRIDE - 1), models.deepselect_config(512, 163840)
    assert models.DS_WIDE_STRIDE // narrow.round + 1 < narrow.rebet_rounds
    assert (narrow.rebets, wide.rebets) == (False, True)
    assert all(models.deepselect_config(k, 8192).rebets for k in (2048, 4096))


def test_deepselect_needs_no_redo_on_constant_rows() -> None:
    """A first round of one repeated value: its rank-r key is also its k-th, so the later rounds take
    none of the ties in (nothing is bet, no buffer floods)."""
    _, work = models.deepselect_topk(*_rows(np.full(2 * 16384, 3.5, np.float32), 2, 16384), 512)
    assert work.redone.tolist() == [0, 0]
    assert work.appended.tolist() == [models.deepselect_config(512, 16384).round] * 2  # the first round


@settings(max_examples=300, deadline=None)
@given(keys=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_split_coarse_bins_are_ordered_intervals_of_keys(keys: list[int]) -> None:
    """What split.cu's select relies on: a larger key never gets a lower bin, and every key lies in its
    bin's [lo, hi], so the bins above the threshold bin hold only keys above its hi."""
    k = torch.tensor(sorted(keys), dtype=torch.int64)
    bins = models.split_coarse_bin(k)
    lo, hi = models.split_coarse_range(bins)
    assert bool((bins.diff() >= 0).all()) and bool(((bins >= 0) & (bins < 2048)).all())
    assert bool(((lo <= k) & (k <= hi)).all())
    nxt_lo, _ = models.split_coarse_range((bins + 1).clamp(max=2047))
    assert bool((torch.where(bins < 2047, nxt_lo, hi + 1) == hi + 1).all()), "bins tile the keys"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [3, 400])
def test_split_lists_spread_values_and_resolves_concentrated_ones_digit_by_digit(dtype: torch.dtype,
                                                                                 rows: int) -> None:
    """Normal scores leave a small coarse bucket. With more items than blocks, whole rows and the last part
    of a split row list it and finish it alone after the first round; with few rows, split over the idle
    grid, a row's parts resolve it together, one more round over their cached keys. x + 100 and x * 1e-8
    fill the bucket, which is then resolved over the cached keys, digit by digit."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((rows, 60000)).astype(np.float32)
    ends = torch.from_numpy(rng.integers(3000, 40000, rows).astype(np.int32))
    ends[0] = 60000  # longer than the key cache (24K fp32 keys, 48K bf16): split however many rows
    for values, spread in ((x, True), (x + np.float32(100), False), (x * np.float32(1e-8), False)):
        logits = torch.from_numpy(values).to(dtype)
        idx, work = models.split_topk(logits, torch.zeros(rows, dtype=torch.int32), ends, 2048)
        split = work.parts > 1
        assert split[0] and (work.parts.sum() > models.SPLIT_GRID) == (rows > 3)
        if spread and rows == 3:  # one wave: every row is split, none lists
            assert split.all() and (work.listed == 0).all() and work.rounds.max() == 2
        elif spread:  # a bucket the first round takes whole (need == its count) is not listed
            assert ((work.listed == work.parts) | (work.listed == 0)).all() and (work.listed > 0).mean() > 0.7
            assert (work.listed[split] > 0).any() and work.rounds.max() == 1
        elif dtype == torch.float32:  # (bf16 has 4 values per bin at most: its buckets may be small)
            assert (work.listed == 0).all() and (work.rounds >= 2).all()
        for r in range(0, rows, 37):
            n = int(ends[r])
            expected = torch.topk(logits[r, :n].float(), 2048).values.sort().values
            assert torch.equal(logits[r, idx[r].long()].float().sort().values, expected)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(-5, 200_000), min_size=1, max_size=1100), top_k=st.sampled_from([1, 512, 2048]),
       key_bytes=st.sampled_from([2, 4]))
def test_split_plan_keeps_the_kernels_invariants(lengths: list[int], top_k: int, key_bytes: int) -> None:
    """What split.cu relies on: every row is at least one item and at most the grid (the deadlock
    argument), a part never holds more keys than the cache (no re-reads), only rows longer than top_k
    are cut, and above SPLIT_ROWS rows nothing is."""
    n = np.array(lengths)
    parts = models.split_plan(n, top_k, key_bytes)
    valid = np.clip(n, 0, None)
    assert parts.shape == n.shape and (parts >= 1).all() and (parts <= models.SPLIT_GRID).all()
    if n.size > models.SPLIT_ROWS:
        assert (parts == 1).all()
        return
    cut = parts > 1
    assert (valid[cut] > top_k).all()
    cache = models.SPLIT_CACHE_BYTES // key_bytes
    each = -(-valid[cut] // parts[cut])
    assert (each <= cache).all() or (parts[cut][each > cache] == models.SPLIT_GRID).all()


def test_split_plan_spreads_a_lone_long_row_and_keeps_short_rows_whole() -> None:
    parts = models.split_plan(np.array([131072, 1024, 2000]), 1536)
    assert parts[0] == 131072 // models.SPLIT_MIN_CHUNK  # the grid is idle: parts of the smallest chunk
    assert models.SPLIT_MIN_CHUNK >= 2000 and list(parts[1:]) == [1, 1]  # not longer than top_k / than a chunk


@settings(max_examples=200, deadline=None)
@given(length=st.integers(1, 70_000), head=st.integers(0, 7), top_k=st.sampled_from([64, 1024, 2048, 4096]),
       stride=st.sampled_from([8192, 16384, 163840]))
def test_deepselect_rounds_visit_every_column_once(length: int, head: int, top_k: int, stride: int) -> None:
    """What the kernel's single pass relies on: its rounds, segment by segment in the permuted order,
    read every column of the row exactly once, and the first round is not the row's first segments."""
    cfg = models.deepselect_config(top_k, stride)
    segments = (length + head + cfg.segment - 1) // cfg.segment
    rounds = (segments + cfg.warps - 1) // cfg.warps
    cols = [models.deepselect_round_columns(cfg, length, head, r) for r in range(rounds)]
    assert sorted(torch.cat(cols).tolist()) == list(range(length))
    if rounds > 2:  # warp 0 starts at the middle segment
        assert not torch.equal(cols[0].sort().values, torch.arange(len(cols[0])))


@pytest.mark.parametrize("name", SELECTORS)
def test_launch_reads_bounds_changed_in_place(name: str) -> None:
    """What CUDA graph replay relies on: a prepared launch picks up new row bounds written in place."""
    from logitreplay.replay.verify import OutputBuffer, check_output, expected_values

    case = Case.from_rows("inplace", np.random.default_rng(4).standard_normal(4 * 300).astype(np.float32),
                          np.zeros(4, np.int32), np.full(4, 300, np.int32), top_k=16, cols=300)
    logits = case.padded()
    starts, ends = torch.from_numpy(case.row_starts.copy()), torch.from_numpy(case.row_ends.copy())
    out = OutputBuffer(case.rows, case.top_k, "cpu")
    launch = build(name).prepare(logits, starts, ends, case.top_k, out.view)
    launch()
    ends.copy_(torch.tensor([300, 7, 150, 0], dtype=torch.int32))
    starts.copy_(torch.tensor([0, 2, 100, 0], dtype=torch.int32))
    out.reset()
    launch()
    assert check_output(case, logits, starts, ends, out, expected_values(logits, starts, ends, case.top_k)) == []


@pytest.mark.parametrize("dist", ["normal+100", "normal*1e-8", "low10", "ties", "relu"])
@pytest.mark.slow
def test_multi_pass_selections_verify(dist: str) -> None:
    """The selections of the extra passes (not only their count) are right, with starts past 0 and bf16."""
    from logitreplay.datasets import synth

    passes = []
    for dtype in ("float32", "bfloat16"):
        for starts in ("zero", "requests"):
            recipe = synth.Recipe("test", "mp", dist, 6, 12288, 512, "causal", 9, dtype=dtype, starts=starts)
            case = synth.generate(recipe)
            result = replay_case(case, [build(n) for n in SELECTORS], torch.device("cpu"), ONCE)
            assert [r.status for r in result.results] == ["ok"] * len(SELECTORS), [(r.selector, r.reason) for r in result.results]
            passes.append(models.case_work(case)["native_passes_max"])
    if dist in ("normal+100", "normal*1e-8", "low10"):
        assert max(passes) >= 2
