"""What a case's bounds show (archive/shape.py), and `auto` dispatching on it: an unlabeled decode batch, MTP
rows and rows shorter than k go where their labelled twins go, every built-in suite's cases read as what
they are, and a label the bounds contradict is noted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.archive.decode import row_ends
from logitreplay.archive.shape import infer, kind_for
from logitreplay.datasets import synth
from logitreplay.selectors.auto import AutoSelector, DispatchRule
from logitreplay.selectors.registry import build

ROOT = Path(__file__).resolve().parents[1]
RULE = ROOT / "bench/results/h200-2026-12-03/rebet/auto-fit/rule.json"  # the committed H200 rule
CPU = torch.device("cpu")


def unlabeled(case: Case) -> Case:
    """The case as an import or a tool that does not label it makes it: its rows and bounds, no `kind`, no
    decode facts."""
    return Case.from_rows(case.case_id + "~unlabeled", case.torch_values(), case.row_starts, case.row_ends,
                          top_k=case.top_k, cols=case.cols, row_stride=case.row_stride)


@pytest.fixture(scope="module")
def auto() -> AutoSelector:
    rule = DispatchRule.load(RULE)
    return AutoSelector(rule, {n: build(n) for n in rule.selectors})


def choice(auto: AutoSelector, case: Case) -> str:
    assert auto.supports(case, CPU) is None
    return auto.choices[case.case_id][0]


@pytest.mark.parametrize("suite", ["decode", "decode-bf16"])
def test_unlabeled_twins_of_decode_cases_go_where_their_labelled_twins_go(auto: AutoSelector, suite: str) -> None:
    """Batches of 1 to 64 requests, MTP (next_n 2), edge rows (some shorter than k, some empty) and
    concentrated scores: the committed H200 rule sends each unlabeled twin where the labelled case goes,
    and says the kind came from the bounds."""
    for case in synth.suite(suite, "small"):
        twin = unlabeled(case)
        assert "kind" not in twin.attrs and twin.kind == "prefill"  # what a label-reading dispatch saw
        assert choice(auto, twin) == choice(auto, case), case.case_id
        assert "decode from the bounds" in auto.choices[twin.case_id][1]


def test_mtp_rows_read_as_decode_with_their_next_n() -> None:
    """Rows in groups of next_n stepping by one (clamped at 0 for a context shorter than next_n)."""
    for next_n in (2, 3, 4):
        seq = np.array([[70000], [2], [123456], [9000], [150001], [1]], dtype=np.int32)
        ends = row_ends(seq, next_n)
        shape = infer(np.zeros_like(ends), ends, 163840, 2048)
        assert (shape.kind, shape.next_n) == ("decode", next_n), shape
        assert f"groups of {next_n} (MTP)" in shape.why
    plain = row_ends(np.array([[70000], [2], [123456], [9000]], dtype=np.int32), 1)
    assert (infer(np.zeros_like(plain), plain, 163840, 2048).next_n, ) == (1, )


def test_rows_shorter_than_k_keep_their_kind(auto: AutoSelector) -> None:
    """A decode batch of short contexts (every row below k) is still a decode batch, and a prefill chunk
    of a short prompt still a chunk; their unlabeled twins go where the labelled ones go."""
    ends = np.array([300, 17, 1500, 900, 42, 2000, 5, 64], dtype=np.int32)
    shape = infer(np.zeros_like(ends), ends, 163840, 2048)
    assert (shape.kind, shape.short) == ("decode", True)
    chunk = np.arange(1, 1025, dtype=np.int32)
    shape = infer(np.zeros_like(chunk), chunk, 1024, 2048)
    assert (shape.kind, shape.short) == ("prefill", True)

    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((8, 163840)).astype(np.float32))
    facts = {"batch": 8, "next_n": 1, "seq_lens": [[int(e)] for e in ends], "max_seq_len": 2000,
             "max_model_len": 163840, "backend": None, "speculative": False}
    labelled = Case.from_matrix("short", x, np.zeros(8, np.int32), ends, top_k=2048,
                                attrs={"kind": "decode", "decode": facts})
    twin = Case.from_matrix("short~unlabeled", x, np.zeros(8, np.int32), ends, top_k=2048)
    assert choice(auto, twin) == choice(auto, labelled)


def test_every_built_in_case_reads_as_its_kind() -> None:
    """Prefill chunks (ramps, causal, several requests, edge rows, strides) and decode batches (flooded
    bins, MTP, equal contexts) of every suite, at full scale, from their bounds alone."""
    for name in synth.SUITES:
        for recipe in synth.recipes(name, "full"):
            starts, ends = synth.bounds(recipe)
            shape = infer(starts, ends, recipe.cols, recipe.top_k)
            want = "decode" if isinstance(recipe, synth.DecodeRecipe) else "prefill"
            assert shape.kind == want, (recipe.case_id, shape)
            assert shape.next_n == getattr(recipe, "next_n", 1), (recipe.case_id, shape)


def test_a_label_is_kept_and_checked_against_the_bounds() -> None:
    climbing = np.arange(4000, 4512, dtype=np.int32)
    zeros = np.zeros_like(climbing)
    assert kind_for({"kind": "prefill"}, zeros, climbing, 8192, 512) == ("prefill", "labelled prefill")
    kind, note = kind_for({"kind": "decode"}, zeros, climbing, 8192, 512)
    assert kind == "decode" and note.startswith("labelled decode, but the bounds show prefill: ends climb by one")
    assert kind_for({}, zeros, climbing, 8192, 512)[0] == "prefill"
