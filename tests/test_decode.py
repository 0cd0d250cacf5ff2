"""Decode cases: the facts of a decode top-k call on a case (vLLM 0.33's row-end rule, validation naming the
field), the `decode` / `decode-bf16` control suites, the CPU selectors on rows far shorter than a
163840-wide matrix, and replay/recommend keeping decode apart from prefill."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from logitreplay.archive import Archive, ArchiveError, Case, DecodeFacts
from logitreplay.archive.decode import row_ends
from logitreplay.cli import main
from logitreplay.datasets import synth
from logitreplay.replay.engine import replay_case
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.recommend import recommend
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult
from logitreplay.replay.sources import describe_source
from logitreplay.selectors.base import Launch
from logitreplay.selectors.registry import build

SELECTORS = ("reference", "native", "deepselect", "split")
ONCE = TimingProtocol(warmup=0, rounds=1, samples_per_round=1, l2="warm", timer="wall", graphs=False)
WIDE = 163840


def _vllm_row_ends(seq_lens: torch.Tensor, next_n: int, num_rows: int) -> torch.Tensor:
    """`SparseIndexerTopk._row_ends` of vLLM 0.33 (indexer_topk.py l.278-300), as written there."""
    if seq_lens.numel() == num_rows:
        return seq_lens.reshape(-1)
    offsets = torch.arange(next_n, dtype=torch.int32)
    return (seq_lens.reshape(-1, 1) - next_n + 1 + offsets).clamp_(min=0).reshape(-1)


@settings(max_examples=80, deadline=None)
@given(batch=st.integers(1, 9), next_n=st.integers(1, 4), per_row=st.booleans(),
       lens=st.lists(st.integers(0, 300), min_size=9, max_size=9))
def test_row_ends_follow_vllm_for_both_seq_lens_layouts(batch: int, next_n: int, per_row: bool,
                                                         lens: list[int]) -> None:
    request = torch.tensor(lens[:batch], dtype=torch.int32)
    if per_row:  # the builder's native MTP form (mla/indexer.py l.1263-1281): (B, next_n) per-row lengths
        seq_lens = (request[:, None] - next_n + 1 + torch.arange(next_n, dtype=torch.int32)).clamp_(min=0)
    else:
        seq_lens = request[:, None]
    want = _vllm_row_ends(seq_lens, next_n, batch * next_n).numpy()
    assert np.array_equal(row_ends(seq_lens.numpy(), next_n), want)
    facts = DecodeFacts.from_row_ends(want, next_n=next_n, per_row=per_row, max_model_len=400)
    assert np.array_equal(facts.seq_lens_array(), seq_lens.numpy()) and np.array_equal(facts.row_ends(), want)


def _decode_case(ends: list[int], *, next_n: int = 1, cols: int = 64, top_k: int = 4,
                 overrides: dict[str, object] | None = None) -> Case:
    e = np.array(ends, dtype=np.int32)
    facts = DecodeFacts.from_row_ends(e, next_n=next_n, per_row=next_n > 1, max_model_len=cols,
                                      speculative=next_n > 1).to_json()
    facts.update(overrides or {})
    values = np.arange(int(e.sum()), dtype=np.float32)
    return Case.from_rows("dec", values, np.zeros_like(e), e, top_k=top_k, cols=cols,
                          attrs={"kind": "decode", "decode": facts})


def test_a_decode_case_round_trips_with_its_facts(tmp_path: Path) -> None:
    case = _decode_case([9, 10, 40, 41], next_n=2, overrides={"backend": "persistent"})
    archive = Archive.create(tmp_path / "a.zarr")
    archive.write(case)
    back = Archive.open(tmp_path / "a.zarr").read("dec")
    assert back.kind == "decode" and back.decode == case.decode
    assert back.decode is not None and back.decode.seq_lens == ((9, 10), (40, 41))
    assert (back.decode.batch, back.decode.next_n, back.decode.speculative) == (2, 2, True)
    assert back.decode.max_seq_len == 41 and back.decode.backend == "persistent"


@pytest.mark.parametrize(("overrides", "field"), [
    ({"seq_lens": [[9], [41]]}, "decode.seq_lens"),  # (B, 1) form: request 1's rows would end at 8 and 9
    ({"seq_lens": [[9, 10], [40, 40]]}, "decode.seq_lens"),  # row 3 ends at 41, not 40
    ({"batch": 3}, "decode.batch"),
    ({"max_model_len": 128}, "decode.max_model_len"),
    ({"max_seq_len": 40}, "decode.max_seq_len"),
    ({"next_n": 0}, "decode.next_n"),
    ({"speculative": "yes"}, "decode.speculative"),
    ({"seq_lens": [[9, 10, 11], [40, 41, 42]]}, "decode.seq_lens"),
])
def test_a_decode_case_whose_rows_do_not_match_its_facts_is_refused_naming_the_field(
        overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ArchiveError) as e:
        _decode_case([9, 10, 40, 41], next_n=2, overrides=overrides)
    message = str(e.value)
    assert f"field {field}:" in message and message.startswith("case dec:") and "\n" not in message


def test_decode_rows_start_at_zero_and_kinds_are_known() -> None:
    case = _decode_case([3, 5])
    with pytest.raises(ArchiveError, match="field row_starts: row 1 starts at 1"):
        Case.from_rows("dec", case.values[1:], np.array([0, 1], np.int32), case.row_ends, top_k=4, cols=64,
                       attrs=case.attrs)
    with pytest.raises(ArchiveError, match="field kind: 'prefil' is not one of prefill, decode"):
        Case.from_rows("p", case.values, case.row_starts, case.row_ends, top_k=4, cols=64, attrs={"kind": "prefil"})
    with pytest.raises(ArchiveError, match="field decode: missing"):
        Case.from_rows("p", case.values, case.row_starts, case.row_ends, top_k=4, cols=64, attrs={"kind": "decode"})


def test_prefill_cases_are_untouched() -> None:
    """A prefill case carries no decode attribute and is of kind prefill; its recipe is the old one."""
    for name in ("seed-controls", "stress"):
        for recipe in synth.recipes(name, "small")[:2]:
            case = synth.generate(recipe)
            assert case.kind == "prefill" and case.decode is None
            assert set(case.attrs) == {"source", "distribution", "recipe"}
            assert "next_n" not in case.attrs["recipe"]


# ---------------------------------------------------------------------------------------- the suites


def test_the_decode_suite_holds_the_served_shapes() -> None:
    recipes = synth.recipes("decode", "full")
    facts = [synth.decode_facts(r) for r in recipes]  # the lengths alone, no logits drawn
    shapes = {(f.batch, f.next_n, r.top_k) for r, f in zip(recipes, facts, strict=True) if r.group == "batch"}
    assert shapes == {(b, n, k) for b in (1, 8, 32, 64, 65, 128, 256) for n in (1, 2) for k in (512, 2048)}
    assert {r.distribution for r in recipes} >= {"normal", "normal+100", "normal*1e-8"}
    for r, f in zip(recipes, facts, strict=True):
        assert r.cols == f.max_model_len == 163840 and r.rows == f.rows and r.row_stride is None
        assert f.speculative == (f.next_n > 1) and f.seq_lens_array().shape == (f.batch, f.next_n)
        if r.seq_lens == "mixed":
            lens = f.seq_lens_array()[:, -1]
            assert lens.max() == 131072 and lens.min() >= 1024 and (f.batch < 2 or lens.min() == 1024)
    edge = next(f for r, f in zip(recipes, facts, strict=True) if r.seq_lens == "edges" and r.next_n == 2)
    assert {0, 163840} <= set(edge.row_ends().tolist())  # clamped rows and full-width rows
    ids = [r.case_id for r in recipes]
    assert len(set(ids)) == len(ids)
    bf16 = synth.recipes("decode-bf16", "full")
    assert [replace(r, suite="decode", dtype="float32") for r in bf16] == recipes
    assert all(r.case_id.split("-")[-1] in ("bf16", "edges") and "-bf16" in r.case_id for r in bf16)


def test_small_scale_shrinks_widths_and_keeps_the_batches_apart() -> None:
    full, small = synth.recipes("decode", "full"), synth.recipes("decode", "small")
    assert len({r.case_id for r in small}) == len(small) == len(full)
    for f, s in zip(full, small, strict=True):
        assert s.cols == f.cols // synth.SMALL_DECODE_DIVISOR and s.top_k == f.top_k and s.next_n == f.next_n
        assert s.batch == -(-f.batch // 4)
        if f.seq_lens == "mixed":  # the same requests, each length divided
            want = synth.decode_facts(f).seq_lens_array()[:s.batch, -1] // synth.SMALL_DECODE_DIVISOR
            assert np.array_equal(synth.decode_facts(s).seq_lens_array()[:, -1], want[:s.batch])
    assert sum(r.rows * r.cols for r in small) < 8_000_000  # a CPU replays it in seconds


def test_decode_ablation_shares_lengths_and_draws() -> None:
    cases = {r.distribution: synth.generate(r) for r in synth.recipes("decode", "small")
             if r.group == "dist" and r.batch == 16}
    base = cases["normal"]
    for dist, shifted in (("normal+100", 100), ("normal*1e-8", None)):
        other = cases[dist]
        assert np.array_equal(other.row_ends, base.row_ends) and other.decode == base.decode
        x, y = base.torch_values(), other.torch_values()
        assert torch.equal(y, x + 100) if shifted else torch.equal(y, x * np.float32(1e-8))


def test_generated_decode_cases_carry_their_facts() -> None:
    recipe = next(r for r in synth.recipes("decode-bf16", "small") if r.next_n == 2)
    case = synth.generate(recipe)
    assert case.kind == "decode" and case.dtype == "bfloat16" and case.decode is not None
    assert np.array_equal(case.row_ends, case.decode.row_ends()) and not case.row_starts.any()
    assert case.decode.backend is None and case.decode.speculative
    assert describe_source(case).startswith(f"normal, decode b{recipe.batch} n2 ctx ")


# ---------------------------------------------------------------------------------------- selectors


def _wide_case(poisoned_ends: list[int], top_k: int, dtype: str) -> Case:
    """Decode rows a few cells to a few thousand long in a 163840-wide matrix; the largest values of each
    row sit right at its end, so reading one cell too far would pick poison or drop a value."""
    ends = np.array(poisoned_ends, dtype=np.int32)
    rng = np.random.default_rng(5)
    values = torch.from_numpy(rng.standard_normal(int(ends.sum())).astype(np.float32))
    if dtype == "bfloat16":
        values = values.to(torch.bfloat16)
    facts = DecodeFacts.from_row_ends(ends, next_n=1, per_row=False, max_model_len=WIDE, backend="persistent")
    return Case.from_rows("wide", values, np.zeros_like(ends), ends, top_k=top_k, cols=WIDE,
                          attrs={"kind": "decode", "decode": facts.to_json()})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("poison", [1e30, float("nan")])  # the engine's two poisons (--poison)
def test_builtins_never_read_past_a_short_row_in_a_wide_matrix(dtype: str, poison: float) -> None:
    case = _wide_case([0, 1, 5, 511, 512, 513, 2047, 3000, 70000, WIDE], 512, dtype)
    result = replay_case(case, [build(n) for n in SELECTORS], torch.device("cpu"), ONCE, poison=poison)
    for res in result.results:
        assert res.status == "ok", f"{res.selector}: {res.reason} {[str(f) for f in res.failures]}"


class _ReadsWholeRow:
    """A selector that ignores the row ends: what the wide-row test must catch."""

    name = "whole-row"

    def supports(self, case: Case, device: torch.device) -> str | None:
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        def launch() -> None:
            out.copy_(torch.topk(logits.float().nan_to_num(), top_k, dim=1).indices.to(torch.int32))

        return launch


def test_reading_past_the_row_end_fails_verification() -> None:
    case = _wide_case([600, 3000], 512, "float32")
    (res,) = replay_case(case, [_ReadsWholeRow()], torch.device("cpu"), ONCE).results
    assert res.status == "failed" and res.failures


def test_cli_decode_suite_replays_strict(tmp_path: Path) -> None:
    """`synth --suite decode --scale small` then `replay --strict` on two of its cases (the whole suite
    is the slow test below)."""
    out = tmp_path / "d.zarr"
    r = CliRunner().invoke(main, ["synth", "--suite", "decode", "--scale", "small", "--out", str(out)])
    assert r.exit_code == 0, r.output
    archive = Archive.open(out)
    assert len(archive) == len(synth.recipes("decode", "small"))
    picked = [cid for cid in archive.case_ids() if cid.startswith(("edges-", "batch-normal-c5120-b2-n2"))]
    few = Archive.create(tmp_path / "few.zarr")
    for cid in picked:
        few.write(archive.read(cid))
    report = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["replay", str(tmp_path / "few.zarr"), "--strict", "--json", str(report)])
    assert r.exit_code == 0, r.output
    data = json.loads(report.read_text())
    assert {c["kind"] for c in data["cases"]} == {"decode"} and len(data["cases"]) == len(picked) == 4
    assert all(res["status"] == "ok" for c in data["cases"] for res in c["results"])
    assert any("decode b16 n2 ctx 0-5K" in c["source"] for c in data["cases"])


@pytest.mark.slow
def test_the_whole_small_decode_suite_verifies_strict(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["replay", "--suite", "decode", "--scale", "small", "--strict",
                                  "--selectors", ",".join(SELECTORS), "--json", str(report)])
    assert r.exit_code == 0, r.output
    data = json.loads(report.read_text())
    assert len(data["cases"]) == len(synth.recipes("decode", "small"))
    assert {res["selector"] for c in data["cases"] for res in c["results"]} == set(SELECTORS)
    assert all(res["status"] == "ok" for c in data["cases"] for res in c["results"])


# ---------------------------------------------------------------------------------------- recommend


def _timed(case_id: str, rows: int, cols: int, kind: str, a: float, b: float) -> CaseResult:
    case = CaseResult(case_id, rows, cols, 2048, "float32", cols, "normal", rows * 4096, kind=kind)
    case.results = [SelectorResult("cooperative", "ok", timing=Timing([a], "cuda-events")),
                    SelectorResult("persistent", "ok", timing=Timing([b], "cuda-events"))]
    return case


def test_decode_rules_run_over_rows_and_never_mix_with_prefill() -> None:
    cases = [_timed("d8", 8, WIDE, "decode", 20, 30), _timed("d64", 64, WIDE, "decode", 40, 60),
             _timed("d128", 128, WIDE, "decode", 90, 60),
             # prefill cases of the same width and opposite verdict must not bend the decode rule
             _timed("p1", 1024, WIDE, "prefill", 500, 100), _timed("p2", 2048, 8192, "prefill", 500, 100)]
    result = ReplayResult("cuda:0", "test", TimingProtocol(), {}, "cooperative", ["cooperative", "persistent"], cases)
    rules = {r.kind: r for r in recommend(result)}
    decode, prefill = rules["decode"], rules["prefill"]
    assert set(decode.ratios) == {8, 64, 128} and set(prefill.ratios) == {8192, WIDE}
    (cross,) = decode.crossovers
    assert (cross.below, cross.above, cross.lower_width, cross.upper_width) == ("cooperative", "persistent", 64, 128)
    assert "float32 decode, cooperative vs persistent: cooperative when rows <" in decode.rule
    assert prefill.rule == ("float32: persistent faster than cooperative at every measured width "
                            "(8192-163840 columns)")
