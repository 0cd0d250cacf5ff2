"""The indexer suites: scores made as a DSA indexer makes them, reproducible from their recorded recipe,
within causal and decode bounds, from FP8-rounded q and k; and the flooded rows of `stress`."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from logitreplay.cli import main
from logitreplay.datasets import synth
from logitreplay.datasets.indexer import MODELS, Indexer, IndexerModel, fp8_blocks
from logitreplay.selectors.cpu_models import f16_bin, f32_key, split_coarse_bin

V32 = IndexerModel.of("deepseek-v3.2")


def _prefill(seed: int = 7, m: IndexerModel = V32, rows: int = 24, cols: int = 640) -> synth.IndexerRecipe:
    return synth.IndexerRecipe("t", "v32", "indexer", rows, cols, 64, "causal", seed, indexer=m)


def test_the_real_indexers_heads_and_dims() -> None:
    assert MODELS["deepseek-v3.2"] == (64, 128, 64) and MODELS["glm-5"] == (32, 128, 64)
    recs = synth.recipes("indexer", "full") + synth.recipes("indexer-decode", "full")
    assert {(r.indexer.model, r.indexer.heads, r.indexer.head_dim) for r in recs} == {  # type: ignore[attr-defined]
        ("deepseek-v3.2", 64, 128), ("glm-5", 32, 128)}
    small = synth.recipes("indexer", "small") + synth.recipes("indexer-decode", "small")
    assert all(r.indexer.heads in (32, 64) for r in small)  # type: ignore[attr-defined]  # small keeps heads


def test_generation_is_deterministic_per_seed_and_records_every_parameter() -> None:
    a, b, other = synth.generate(_prefill()), synth.generate(_prefill()), synth.generate(_prefill(8))
    assert a.values.tobytes() == b.values.tobytes() and a.values.tobytes() != other.values.tobytes()
    recorded = a.attrs["recipe"]["indexer"]
    assert recorded == {"model": "deepseek-v3.2", "heads": 64, "head_dim": 128, "rope_dim": 64, "fp8": True,
                        "sinks": 1, "sink": 4.0, "recency": 0.2, "repeat": 0.3, "span": 256, "vocab": 8192}
    again = synth.IndexerRecipe(**{**a.attrs["recipe"], "indexer": IndexerModel(**recorded)})
    assert synth.generate(again).values.tobytes() == a.values.tobytes()  # the recipe regenerates the case


def test_prefill_rows_are_causal_and_decode_rows_follow_the_batch() -> None:
    r = _prefill()
    case = synth.generate(r)
    i = np.arange(r.rows)
    assert np.array_equal(case.row_ends, r.cols - r.rows + i + 1) and not case.row_starts.any()
    for d in synth.recipes("indexer-decode", "full"):
        assert isinstance(d, synth.IndexerDecodeRecipe) and d.cols == 163840
        lens = np.asarray(synth.decode_facts(d).seq_lens)[:, -1]  # a request's length: its last row
        if d.seq_lens == "long" and d.batch > 1:
            assert lens.min() == 1024 and lens.max() == 163840  # mixed 1K-160K, both ends pinned
    d = next(x for x in synth.recipes("indexer-decode", "small") if x.next_n == 2)
    case = synth.generate(d)
    facts = case.decode
    assert facts is not None and facts.next_n == 2 and case.kind == "decode"
    assert np.array_equal(case.row_ends, facts.row_ends()) and case.row_ends.max() <= case.cols


def test_q_and_k_are_rounded_to_e4m3_with_power_of_two_block_scales() -> None:
    x = torch.randn(5, 256, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) * 3
    q, scale = fp8_blocks(x)
    assert torch.equal(q.to(torch.float8_e4m3fn).to(torch.float64), q)  # representable in e4m3
    assert torch.equal(scale, torch.exp2(torch.log2(scale).round())) and q.abs().max() <= 448
    # e4m3 rounds to half a unit of its 3 mantissa bits (2^-4 relative), and to half its subnormal step
    # (2^-10 of the block's scale) near zero, where a relative bound alone would not hold
    err = (q.reshape(5, 2, 128) * scale.unsqueeze(-1).double() - x.reshape(5, 2, 128).float().double()).abs()
    bound = torch.maximum(x.reshape(5, 2, 128).abs() * 2.0**-4, scale.unsqueeze(-1).double() * 2.0**-10)
    assert bool((err <= bound * 1.0001).all())
    ix = Indexer(V32, 3)
    text = ix.text(300, np.zeros(1, dtype=np.int64))
    assert torch.equal(text.keys.to(torch.float8_e4m3fn).to(torch.float64), text.keys)
    plain = synth.generate(_prefill(m=replace(V32, fp8=False)))
    assert plain.values.tobytes() != synth.generate(_prefill()).values.tobytes()


def test_sinks_recency_and_repeats_are_what_trained_indexers_show_and_random_weights_do_not() -> None:
    def share_in_top(m: IndexerModel, cols: list[int]) -> float:
        case = synth.generate(_prefill(m=m, rows=32, cols=1024))
        hits = [bool(np.isin(np.argsort(case.row(r).numpy())[-case.top_k:], cols).any()) for r in range(case.rows)]
        return float(np.mean(hits))

    assert share_in_top(replace(V32, sinks=4, sink=6.0), [0]) > 0.9  # the sink is in every row's top k
    assert share_in_top(V32.plain, [0]) < 0.5
    case = synth.generate(_prefill(rows=32, cols=1024))
    last = case.row(case.rows - 1).numpy()
    assert last[-64:].mean() > np.median(last)  # recent keys score above the row's median
    ix = Indexer(replace(V32, repeat=1.0), 1)
    text = ix.text(1024, np.zeros(1, dtype=np.int64))
    assert len(set(text.tokens[256:].tolist()) - set(text.tokens[:256].tolist())) == 0  # spans copied


def test_flooded_rows_hold_exactly_their_count_in_one_coarse_bin_above_the_rest() -> None:
    floods = [r for r in synth.recipes("stress", "small") if isinstance(r, synth.FloodRecipe)]
    full = {r.flood for r in synth.recipes("stress", "full") if isinstance(r, synth.FloodRecipe)}
    assert {16384, 16385, 40000, 6144, 6145, 3072, 3073} <= full
    assert {2048, 2049} <= {r.flood for r in floods}
    for r in floods:
        case = synth.generate(r)
        for row in range(case.rows):
            x = case.row(row)
            top = x >= 1
            assert int(top.sum()) == r.flood and r.flood >= case.top_k and bool((x[~top] <= 0).all())
            assert f16_bin(x[top]).unique().numel() == 1
            key = f32_key(x[top]).to(torch.int64) + 2**31
            assert split_coarse_bin(key).unique().numel() == 1


def test_existing_suites_are_unchanged_by_the_new_ones() -> None:
    stress = synth.recipes("stress", "full")
    first = next(i for i, r in enumerate(stress) if isinstance(r, synth.FloodRecipe))
    assert first == 12 and all(type(r) is synth.Recipe for r in stress[:first])  # the flooded rows come after
    assert all(isinstance(r, synth.FloodRecipe) for r in stress[first:])
    assert [type(r) for r in synth.recipes("decode", "full")] == [synth.DecodeRecipe] * len(synth.recipes("decode", "full"))


@pytest.mark.slow
def test_replay_strict_verifies_small_indexer_suites_on_cpu(tmp_path: Path) -> None:
    for suite, glob in (("indexer", "v32-indexer-c512-*"), ("indexer-decode", "v32-indexer-*-b8-n1-*"),
                        ("stress", "bin-flood-*-b9-*-f2049")):
        out = tmp_path / f"{suite}.json"
        res = CliRunner().invoke(main, ["replay", "--suite", suite, "--scale", "small", "--device", "cpu",
                                        "--case", glob, "--selectors", "reference,native,deepselect,split",
                                        "--strict", "--json", str(out)])
        assert res.exit_code == 0, res.output
        (case,) = json.loads(out.read_text())["cases"]  # the case ran, and every selector verified
        assert fnmatch.fnmatch(case["case_id"], glob) and all(r["status"] == "ok" for r in case["results"])


def test_the_card_says_how_indexer_and_flooded_cases_were_made(tmp_path: Path) -> None:
    from logitreplay.archive import Archive
    from logitreplay.datasets.card import build_card

    archive = Archive.create(tmp_path / "a.zarr")
    archive.write(synth.generate(_prefill()))
    archive.write(synth.generate(next(r for r in synth.recipes("stress", "small") if isinstance(r, synth.FloodRecipe))))
    text = str(build_card(archive, "org/indexer"))
    assert "1 indexer case(s)" in text and "deepseek-v3.2 (64 heads x 128)" in text and "FP8 e4m3" in text
    assert "1 flooded-bin case(s) (`provenance.recipe.flood`: 2048)" in text
