"""The long-context suites (`long`, `long-decode`): the shapes issue 41 asks for, each indexer case with a
normal twin of the same rows, the flooded rows of `stress` at 2^20 columns, multi-request chunks scored
as documents of their own; and the CPU models' selections at 2^20 columns (bounds at the row's far end,
padded strides, bf16) and on decode rows shorter than next_n, verified as a replay verifies them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.datasets import synth
from logitreplay.replay.engine import replay_case
from logitreplay.replay.protocol import TimingProtocol
from logitreplay.selectors.registry import build

SELECTORS = ("reference", "native", "deepselect", "split")
ONCE = TimingProtocol(warmup=0, rounds=1, samples_per_round=1, l2="warm", timer="wall", graphs=False)
WIDTH = 1 << 20


def _verify(case: Case, poison: float = 1e30) -> None:
    result = replay_case(case, [build(n) for n in SELECTORS], torch.device("cpu"), ONCE, poison=poison)
    for res in result.results:
        assert res.status == "ok", f"{case.case_id} {res.selector}: {res.reason} {[str(f) for f in res.failures]}"


def test_long_prefill_chunks_are_256k_to_1m_wide_causal_and_multi_request() -> None:
    full = synth.recipes("long", "full")
    indexer = [r for r in full if isinstance(r, synth.IndexerRecipe)]
    assert {(r.cols, r.rows, r.starts) for r in indexer} == set(synth.LONG_CHUNKS)
    assert {r.cols for r in full} == {262144, 524288, WIDTH} and all(r.top_k == 2048 for r in full)
    twins = [r for r in full if r.distribution == "normal"]
    assert [(r.cols, r.rows, r.starts, r.seed) for r in twins] == [(r.cols, r.rows, r.starts, r.seed) for r in indexer]
    assert all(r.rows * r.cols == 1 << 27 for r in indexer)  # 512 MiB of fp32 per chunk


def test_long_decode_batches_span_1_to_256_rows_next_n_1_and_2_and_three_k() -> None:
    full = synth.recipes("long-decode", "full")
    assert all(isinstance(r, synth.DecodeRecipe) and r.cols == WIDTH for r in full)
    decode = [r for r in full if isinstance(r, synth.DecodeRecipe)]
    assert min(r.rows for r in decode) == 1 and max(r.rows for r in decode) == 256
    assert {r.next_n for r in decode} == {1, 2} and {r.top_k for r in decode} == {512, 1024, 2048}
    indexer = [r for r in decode if isinstance(r, synth.IndexerDecodeRecipe)]
    twins = {r.seed: r for r in decode if r.group == "ctl"}
    for r in indexer:  # the normal twin holds the same rows
        assert np.array_equal(synth.bounds(r)[1], synth.bounds(twins[r.seed])[1])
        lens = np.asarray(synth.decode_facts(r).seq_lens)[:, -1]
        if r.batch > 1:
            assert lens.min() == 1024 and lens.max() == WIDTH
    for r in (r for r in decode if r.seq_lens == "edges"):
        ends = synth.bounds(r)[1]
        assert (ends < r.next_n).any() and (ends < r.top_k).any() and ends.max() == WIDTH


def test_flooded_rows_get_1m_column_twins_and_stress_keeps_its_own() -> None:
    def floods(suite: str) -> set[tuple[int, int]]:
        return {(r.rows, r.flood) for r in synth.recipes(suite, "full") if isinstance(r, synth.FloodRecipe)}

    assert floods("long-decode") == floods("stress") | {(256, synth.LONG_FLOOD)}
    assert synth.LONG_FLOOD >= 8 * synth.PERSISTENT_TOPK_CAPACITY
    assert {r.cols for r in synth.recipes("stress", "full") if isinstance(r, synth.FloodRecipe)} == {163840}
    for r in (r for r in synth.recipes("long-decode", "small") if isinstance(r, synth.FloodRecipe)):
        case = synth.generate(r)
        assert all(int((case.row(i) >= 1).sum()) == r.flood for i in range(case.rows))


def test_a_multi_request_chunk_scores_each_request_as_a_document_of_its_own() -> None:
    r = replace(next(x for x in synth.recipes("long", "small") if isinstance(x, synth.IndexerRecipe)
                     and x.starts == "requests"), rows=24, cols=3072)
    case = synth.generate(r)
    assert sorted(set(case.row_starts.tolist())) == [0, r.cols // 3, 2 * (r.cols // 3)]
    again = synth.generate(r)
    assert again.values.tobytes() == case.values.tobytes()
    # Each request's first key is a sink: it scores above the row's median in most rows.
    above = [float(case.row(i)[0]) > float(case.row(i).median()) for i in range(case.rows)]
    assert np.mean(above) > 0.5


def edge_case(dtype: torch.dtype, stride: int | None) -> Case:
    """Rows that end at the 2^20th column, start one or k from it, hold nothing, or lie in the middle
    (also tests/gpu/test_gpu_long.py's)."""
    k, w = 2048, WIDTH
    bounds = [(0, w), (w - 1, w), (w - k, w), (w - k - 1, w), (w, w), (w // 2, w // 2 + k - 1), (12345, w)]
    starts = np.array([s for s, _ in bounds], dtype=np.int32)
    ends = np.array([e for _, e in bounds], dtype=np.int32)
    values = torch.from_numpy(np.random.default_rng(41).standard_normal(int((ends - starts).sum()), dtype=np.float32))
    return Case.from_rows("edges-2p20", values.to(dtype), starts, ends, top_k=k, cols=w, row_stride=stride)


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "stride"), [(torch.float32, None), (torch.bfloat16, synth._deepgemm_stride(WIDTH))])
def test_cpu_models_select_exactly_at_2_20_columns(dtype: torch.dtype, stride: int | None) -> None:
    """`edge_case`, NaN in every cell outside the bounds (a read past them fails the check)."""
    _verify(edge_case(dtype, stride), poison=float("nan"))


@pytest.mark.slow
def test_cpu_models_select_decode_rows_shorter_than_next_n_at_2_20_columns() -> None:
    """`short_decode_case`: rows of 0 and 1 elements, shorter than next_n and than k, get -1 tails."""
    case = short_decode_case()
    assert case.decode is not None and case.decode.next_n == 2
    ends = case.row_ends
    assert ends[:4].tolist() == [0, 0, 0, 1] and ends.max() == WIDTH  # requests of 0 and 1 tokens
    _verify(case)


def short_decode_case() -> Case:
    """An MTP batch (next_n 2) of a 2^20-wide matrix whose requests hold 0, 1, next_n, around k and all
    2^20 tokens (also tests/gpu/test_gpu_long.py's)."""
    return synth.generate(synth._decode_recipe("t", "edges", "normal", 9, 2, 2048, 3, "edges", WIDTH))
