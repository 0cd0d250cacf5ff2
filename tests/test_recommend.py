"""`replay --recommend`: the crossover width between two selectors, interpolated between the measured
widths that bound it, and a plain rule when one selector wins everywhere."""

from __future__ import annotations

import math

import pytest

from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.recommend import recommend
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult


def _result(times: dict[int, tuple[float, float]]) -> ReplayResult:
    cases = []
    for cols, (native, deepselect) in times.items():
        case = CaseResult(f"c{cols}", 1024, cols, 512, "float32", cols, "synthetic normal", cols * 4096)
        case.results = [SelectorResult("native", "ok", timing=Timing([native], "cuda-events")),
                        SelectorResult("deepselect", "ok", timing=Timing([deepselect], "cuda-events"))]
        cases.append(case)
    return ReplayResult("cuda:0", "test", TimingProtocol(), {}, "native", ["native", "deepselect"], cases)


def test_crossover_is_interpolated_between_its_bounding_widths() -> None:
    # native 2x faster at 4096, deepselect 2x faster at 16384: equal at the geometric middle, 8192.
    (rule,) = recommend(_result({1024: (50, 200), 4096: (100, 200), 16384: (400, 200)}))
    (cross,) = rule.crossovers
    assert cross.width == pytest.approx(8192)
    assert (cross.below, cross.above) == ("native", "deepselect")
    assert (cross.lower_width, cross.upper_width) == (4096, 16384)
    assert cross.lower_cases == ["c4096"] and cross.upper_cases == ["c16384"]
    assert "native when cols < 8192" in rule.rule and "deepselect when cols >= 8192" in rule.rule
    assert math.isclose(rule.ratios[16384], 2.0)
    assert rule.to_json()["ratios"]["16384"] == pytest.approx(2.0)


def test_one_winner_everywhere_is_said_plainly() -> None:
    (rule,) = recommend(_result({4096: (100, 200), 16384: (150, 200)}))
    assert rule.crossovers == []
    assert rule.rule == "float32: native faster than deepselect at every measured width (4096-16384 columns)"


def test_pairs_without_timings_give_no_rule() -> None:
    result = _result({4096: (100, 200)})
    result.cases[0].results[1] = SelectorResult("deepselect", "unsupported", reason="no GPU")
    assert recommend(result) == []


def test_a_source_measured_at_several_widths_gets_its_own_rule() -> None:
    # Normal logits: native faster up to 8192 columns, deepselect from 32768. A concentrated distribution
    # exists only at 8192 columns, where it favours deepselect so much that the all-cases rule moves the
    # crossing below 8192.
    result = _result({4096: (1.0, 2.0), 8192: (1.0, 1.5), 32768: (2.0, 1.0)})
    for case in result.cases:
        case.source = "normal"
    concentrated = CaseResult("c8192-plus100", 1024, 8192, 512, "float32", 8192, "normal+100", 8192 * 4096)
    concentrated.results = [SelectorResult("native", "ok", timing=Timing([20.0], "cuda-events")),
                            SelectorResult("deepselect", "ok", timing=Timing([1.0], "cuda-events"))]
    result.cases.append(concentrated)
    rules = {r.source: r for r in recommend(result)}
    assert [4096 < c.width < 8192 for c in rules[None].crossovers] == [True]
    normal = rules["normal"]
    assert [(c.below, c.above) for c in normal.crossovers] == [("native", "deepselect")]
    assert 8192 < normal.crossovers[0].width < 32768 and "[normal only]" in normal.rule
    assert "normal+100" not in rules  # measured at one width: no rule of its own


def test_evaluate_scores_each_case_by_the_rule_and_by_its_width_alone() -> None:
    from logitreplay.replay.recommend import evaluate, fit_rule

    result = _result({4096: (100, 200), 16384: (400, 200)})
    plus = CaseResult("plus100", 1024, 4096, 512, "float32", 4096, "normal+100", 4096 * 4096)
    plus.results = [SelectorResult("native", "ok", timing=Timing([2000], "cuda-events")),
                    SelectorResult("deepselect", "ok", timing=Timing([200], "cuda-events"))]
    again = _result({4096: (110, 200)}).cases[0]
    again.case_id = "c4096-b"
    result.cases += [plus, again]  # two normal cases beside one concentrated: native wins at 4096
    feats = {"c4096": {"bin_load": 0.01}, "c4096-b": {"bin_load": 0.01}, "c16384": {"bin_load": 0.02},
             "plus100": {"bin_load": 4.0}}
    rule = fit_rule(result, case_features=feats)
    rows = {e.case_id: e for e in evaluate(rule, result, feats)}
    assert rows["plus100"].chosen == "deepselect" and rows["plus100"].ratio == pytest.approx(1.0)
    assert rows["plus100"].width_ratio == pytest.approx(10.0) and "bin_load" in rows["plus100"].why
    assert rows["c4096"].ratio == pytest.approx(1.0) and "cols 4096" in rows["c4096"].why
