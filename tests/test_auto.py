"""The dispatch rule as an artifact (`replay --recommend --rule-out`) and the `auto` selector that follows
it (`--selectors auto --rule`): the fit's intervals, boundaries and overturns on measurements with known
winners, the file format, and auto's dispatch checked case by case."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from logitreplay.cli import main
from logitreplay.errors import DecisionError, SelectorError
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.recommend import fit_rule
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult
from logitreplay.selectors.auto import RULE_ENV, DispatchRule

NO_RULE = {RULE_ENV: None}  # each invocation starts without one, and what it sets is undone after it


def _case(cid: str, cols: int, native: float, deepselect: float, source: str = "normal", dtype: str = "float32",
          kind: str = "prefill") -> CaseResult:
    case = CaseResult(cid, 1024, cols, 512, dtype, cols, source, cols * 4096, kind=kind)
    case.results = [SelectorResult("native", "ok", timing=Timing([native])),
                    SelectorResult("deepselect", "ok", timing=Timing([deepselect]))]
    return case


def _result(*cases: CaseResult) -> ReplayResult:
    return ReplayResult("cuda:0", "t", TimingProtocol(), {"gpu": "H200"}, "native", ["native", "deepselect"],
                        list(cases))


def test_fit_gives_intervals_a_boundary_with_its_cases_and_margins_and_the_overturns() -> None:
    rule = fit_rule(_result(
        _case("n4k-a", 4096, 100, 200), _case("n4k-b", 4096, 110, 200),
        _case("plus100-4k", 4096, 2000, 210, source="normal+100"),  # one adversarial case beside two normal
        _case("n16k", 16384, 400, 200)))
    (scope,) = rule.scopes
    assert (scope.dtype, scope.kind) == ("float32", "prefill")
    # The crossing of the median log ratios (0.55 at 4096, 2 at 16384), interpolated in log width:
    # the adversarial case does not drag it down to 4096.
    edge = round(4096 * 4 ** (math.log(1 / 0.55) / math.log(2 / 0.55)))
    assert [(i.lo, i.hi, i.selector) for i in scope.intervals] == [(0, edge, "native"),
                                                                              (edge, None, "deepselect")]
    (b,) = scope.boundaries
    assert (b.below, b.above, b.lower_width, b.upper_width) == ("native", "deepselect", 4096, 16384)
    assert b.lower_cases == ["n4k-a", "n4k-b", "plus100-4k"] and b.upper_cases == ["n16k"]
    assert b.margin_below == pytest.approx(1 / 0.55) and b.margin_above == pytest.approx(2.0)
    (o,) = scope.overturned
    assert (o.source, o.position, o.rule_selector, o.faster, o.cases) == ("normal+100", 4096, "native", "deepselect",
                                                                      ["plus100-4k"])
    assert o.margin == pytest.approx(2000 / 210)
    assert rule.selectors == ["native", "deepselect"] and rule.fitted_on["gpu"] == "H200"


def test_each_dtype_and_kind_gets_its_own_rule_and_a_default_covers_the_rest() -> None:
    rule = fit_rule(_result(_case("f", 4096, 100, 200), _case("b", 4096, 300, 200, dtype="bfloat16"),
                            _case("d", 4096, 300, 100, kind="decode")))
    assert [(s.dtype, s.kind, s.intervals[0].selector) for s in rule.scopes] == [
        ("bfloat16", "prefill", "deepselect"), ("float32", "decode", "deepselect"), ("float32", "prefill", "native")]
    assert rule.choose("bfloat16", "decode", 8, 4096) == ("deepselect", "no rule for bfloat16 decode: default deepselect")


def test_decode_rules_run_over_rows() -> None:
    def decode(cid: str, rows: int, native: float, deepselect: float) -> CaseResult:
        case = _case(cid, 131072, native, deepselect, kind="decode")
        case.rows = rows
        return case

    rule = fit_rule(_result(decode("d8", 8, 10, 20), decode("d512", 512, 80, 40)))
    (scope,) = rule.scopes
    assert [(i.lo, i.hi, i.selector) for i in scope.intervals] == [(0, 64, "native"), (64, None, "deepselect")]
    assert rule.choose("float32", "decode", 63, 131072)[0] == "native"
    assert rule.choose("float32", "decode", 64, 131072) == ("deepselect", "float32 decode, 64 <= rows 64")


def test_choose_follows_the_intervals_at_their_edges() -> None:
    rule = fit_rule(_result(_case("a", 4096, 100, 200), _case("b", 16384, 400, 200)))
    edge = rule.scopes[0].intervals[0].hi
    assert edge is not None
    assert rule.choose("float32", "prefill", 1024, edge - 1)[0] == "native"
    assert rule.choose("float32", "prefill", 1024, edge)[0] == "deepselect"
    assert rule.choose("float32", "prefill", 1024, 1)[0] == "native"
    assert rule.choose("float32", "prefill", 1024, 10**7)[0] == "deepselect"


def test_the_rule_file_round_trips_and_bad_files_are_one_line(tmp_path: Path) -> None:
    rule = fit_rule(_result(_case("a", 4096, 100, 200), _case("b", 16384, 400, 200)))
    rule.save(tmp_path / "rule.json")
    assert DispatchRule.load(tmp_path / "rule.json") == rule
    data = json.loads((tmp_path / "rule.json").read_text())
    data["scopes"][0]["intervals"][0]["selector"] = "nosuch"
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(SelectorError, match="names selectors not in its list: nosuch"):
        DispatchRule.load(tmp_path / "bad.json")
    with pytest.raises(SelectorError, match="cannot read"):
        DispatchRule.load(tmp_path / "missing.json")


def test_no_common_timings_is_a_decision_error() -> None:
    case = _case("a", 4096, 100, 200)
    case.results[1] = SelectorResult("deepselect", "unsupported", reason="no")
    with pytest.raises(DecisionError, match="nothing to fit"):
        fit_rule(_result(case))


@pytest.mark.slow
def test_auto_dispatches_each_case_by_the_rule_it_was_given(tmp_path: Path) -> None:
    fit = CliRunner().invoke(main, ["replay", "--suite", "seed-controls", "--case", "c-normal-c512-*", "--case",
                                    "c-normal-c1024-*", "--selectors",
                                    "native,deepselect", "--recommend", "--rule-out", str(tmp_path / "rule.json")], env=NO_RULE)
    assert fit.exit_code == 0, fit.output
    assert "dispatch rule over native, deepselect written to" in fit.output
    rule = DispatchRule.load(tmp_path / "rule.json")
    res = CliRunner().invoke(main, ["replay", "--suite", "stress", "--case", "dist-relu*", "--case", "bf16-normal*",
                                    "--selectors", "auto,native,deepselect", "--rule", str(tmp_path / "rule.json"),
                                    "--json", str(tmp_path / "r.json")], env=NO_RULE)
    assert res.exit_code == 0, res.output
    assert "auto: the selector the rule chose per case" in res.output and "auto vs the per-case fastest" in res.output
    cases = json.loads((tmp_path / "r.json").read_text())["cases"]
    assert len(cases) == 2
    for case in cases:
        auto = next(r for r in case["results"] if r["selector"] == "auto")
        chosen, why = rule.choose(case["dtype"], case["kind"], case["rows"], case["cols"])
        assert auto["status"] == "ok" and auto["reason"] == f"chose {chosen} ({why})"  # verified, and said


def test_auto_without_a_rule_is_refused_in_one_line() -> None:
    res = CliRunner().invoke(main, ["replay", "--suite", "stress", "--selectors", "auto"], env=NO_RULE)
    assert res.exit_code == 2 and "the auto selector needs --rule RULE.json" in res.output
