"""The dispatch rule as an artifact (`replay --recommend --rule-out`) and the `auto` selector that follows
it (`--selectors auto --rule`): the fit's intervals, boundaries and overturns on measurements with known
winners, the file format, and auto's dispatch checked case by case."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Case
from logitreplay.cli import main
from logitreplay.errors import DecisionError, SelectorError
from logitreplay.replay.compare import AutoScore
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.recommend import auto_summary, fit_reports, fit_rule, rule_device_mismatch
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult
from logitreplay.selectors.auto import (
    RULE_ENV,
    AutoSelector,
    DispatchRule,
    Interval,
    Override,
    Scope,
    parse_note,
)
from logitreplay.selectors.features import features
from logitreplay.selectors.registry import build

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
    assert rule.choose("float32", "decode", 64, 131072) == ("deepselect", "float32 decode, rows 64: rows >= 64")


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
        assert auto["status"] == "ok" and auto["reason"] == (  # verified, and said: the kind read off the bounds
            f"chose {chosen} ({why}; prefill from the bounds: ends climb by one per row (runs up to {case['rows']} "
            "rows))")


def test_auto_without_a_rule_is_refused_in_one_line() -> None:
    res = CliRunner().invoke(main, ["replay", "--suite", "stress", "--selectors", "auto"], env=NO_RULE)
    assert res.exit_code == 2 and "the auto selector needs --rule RULE.json" in res.output


def test_overrides_fitted_on_features_send_the_concentrated_cases_elsewhere_and_name_the_feature() -> None:
    cases = [_case("n4k-a", 4096, 100, 200), _case("n4k-b", 4096, 110, 200), _case("n4k-c", 4096, 105, 190),
             _case("plus100-4k", 4096, 2000, 210, source="normal+100"), _case("n16k", 16384, 400, 200)]
    feats = {c.case_id: {"bin_load": 0.01, "fill": 1.0} for c in cases}
    feats["plus100-4k"]["bin_load"] = 4.0
    width_only = fit_rule(_result(*cases))
    assert width_only.choose("float32", "prefill", 1024, 4096, feats["plus100-4k"])[0] == "native"
    rule = fit_rule(_result(*cases), case_features=feats)
    (o,) = rule.scopes[0].overrides
    assert (o.feature, o.selector, o.cases, o.gained) == ("bin_load", "deepselect", ["plus100-4k"], 1)
    assert 0.01 < o.at_least <= 4.0 and rule.features == ["bin_load"]
    chosen, why = rule.choose("float32", "prefill", 1024, 4096, feats["plus100-4k"])
    assert chosen == "deepselect" and why == f"float32 prefill, bin_load 4 >= {o.at_least:.3g}"
    assert rule.choose("float32", "prefill", 1024, 4096, feats["n4k-a"]) == ("native", rule.choose(
        "float32", "prefill", 1024, 4096)[1])  # below the threshold: the width decides, and says so
    assert "cols 4096" in rule.choose("float32", "prefill", 1024, 4096)[1]


def test_rules_with_overrides_round_trip_and_older_files_still_load(tmp_path: Path) -> None:
    rule = DispatchRule(["native", "deepselect"], [Scope("float32", "prefill", [Interval(0, None, "native")],
                                                         overrides=[Override("bin_load", 0.5, "deepselect", 2, ["x"])])],
                        "native")
    rule.save(tmp_path / "r.json")
    assert DispatchRule.load(tmp_path / "r.json") == rule
    data = json.loads((tmp_path / "r.json").read_text())
    del data["scopes"][0]["overrides"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert DispatchRule.load(tmp_path / "old.json").scopes[0].overrides == []
    data["scopes"][0]["overrides"] = [{"feature": "bin_load", "at_least": 1.0, "selector": "nosuch"}]
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(SelectorError, match="nosuch"):
        DispatchRule.load(tmp_path / "bad.json")


def test_the_rule_reads_in_words() -> None:
    one = fit_rule(_result(_case("a", 4096, 100, 200)))
    assert one.describe()[0] == "rule float32 prefill: native for all cols"
    two = fit_rule(_result(_case("a", 4096, 100, 200), _case("b", 16384, 400, 200)))
    edge = two.scopes[0].intervals[0].hi
    assert two.describe()[0] == f"rule float32 prefill: native for cols < {edge}; deepselect for cols >= {edge}"
    assert not any("0 <=" in line for line in two.describe())
    assert Interval(64, 128, "split").span("rows") == "64 <= rows < 128"


def test_auto_summary_calls_the_largest_ratio_the_worst() -> None:
    score = AutoScore(["native", "deepselect"], 1.03, cases=3, within=2, worst_ratio=1.2, worst_case="b")
    assert auto_summary(score) == "within 3% on 2 of 3 cases (67%); worst 1.20x (b)"
    faster = AutoScore(["native"], 1.03, cases=3, within=3, worst_ratio=0.4, worst_case="c")
    assert "worst" not in auto_summary(faster) and "never slower than the fastest (largest ratio 0.40x, c)" in \
        auto_summary(faster)


def test_a_rule_fitted_on_one_kind_of_device_is_flagged_on_the_other() -> None:
    cpu = fit_rule(ReplayResult("cpu", "t", TimingProtocol(), {}, "native", ["native", "deepselect"],
                                [_case("a", 4096, 100, 200)]))
    assert rule_device_mismatch(cpu, "cpu") is None
    note = rule_device_mismatch(cpu, "cuda:0")
    assert note is not None and "fitted on the CPU models' wall clock" in note and "cuda:0" in note
    gpu = fit_rule(_result(_case("a", 4096, 100, 200)))
    assert rule_device_mismatch(gpu, "cuda:1") is None and "H200" in str(rule_device_mismatch(gpu, "cpu"))


def test_reports_with_different_selectors_fit_one_rule() -> None:
    prefill = _result(_case("p", 4096, 100, 200))
    decode = _case("d", 163840, 300, 200, kind="decode")
    decode.results.append(SelectorResult("split", "ok", timing=Timing([100])))
    rule = fit_reports([prefill, _result(decode)], ["native", "deepselect", "split"], {})
    assert [(s.kind, s.intervals[0].selector) for s in rule.scopes] == [("decode", "split"), ("prefill", "native")]
    assert rule.selectors == ["native", "deepselect", "split"]


def test_auto_computes_the_features_its_rule_needs_and_notes_its_choice() -> None:
    x = torch.randn(128, 2048, generator=torch.Generator().manual_seed(0)) + 100  # one fp16 bin holds the top
    case = Case.from_matrix("plus100", x, torch.zeros(128, dtype=torch.int32), torch.full((128,), 2048), top_k=64)
    assert features(case)["bin_load"] > 1
    rule = DispatchRule(["native", "deepselect"], [Scope("float32", "prefill", [Interval(0, None, "native")],
                                                         overrides=[Override("bin_load", 0.5, "deepselect")])],
                        "native")
    auto = AutoSelector(rule, {n: build(n) for n in rule.selectors})
    assert auto.supports(case, torch.device("cpu")) is None
    assert parse_note(auto.note(case)) == ("deepselect", f"float32 prefill, bin_load {features(case)['bin_load']:.3g}"
                                                         " >= 0.5; prefill from the bounds: 128 rows over 2048 "
                                                         "columns: too many rows for a decode batch")
    assert parse_note("unsupported: no") is None


def test_rule_without_auto_is_refused_in_one_line(tmp_path: Path) -> None:
    rule = fit_rule(_result(_case("a", 4096, 100, 200)))
    rule.save(tmp_path / "rule.json")
    res = CliRunner().invoke(main, ["replay", "--suite", "stress", "--selectors", "native", "--rule",
                                    str(tmp_path / "rule.json")], env=NO_RULE)
    assert res.exit_code == 2 and "only the auto selector follows a rule" in res.output


def test_the_auto_table_flags_a_rule_fitted_on_another_kind_of_device() -> None:
    from rich.console import Console

    from logitreplay.cli.decisions import annotate_auto, print_rule

    cpu_rule = fit_rule(ReplayResult("cpu", "t", TimingProtocol(), {}, "native", ["native", "deepselect"],
                                     [_case("a", 4096, 100, 200)]))
    case = _case("b", 4096, 100, 200)
    case.results.append(SelectorResult("auto", "ok", reason="chose native (float32 prefill, bin_load 3 >= 1)",
                                       timing=Timing([101])))
    result = ReplayResult("cuda:0", "t", TimingProtocol(), {"gpu": "H200"}, "native", ["native", "deepselect", "auto"],
                          [case])
    console = Console(record=True, width=80)
    annotate_auto(result, cpu_rule, console)
    text = console.export_text()
    assert "bin_load 3 >= 1" in text  # the feature auto's note named, not a width-only re-choice
    assert "warning: the dispatch rule was fitted on the CPU models' wall clock" in " ".join(text.split())
    assert any("fitted on the CPU" in n for n in result.notes)  # and the report says so too
    console = Console(record=True, width=80)
    print_rule(cpu_rule, console)
    assert "native for all cols" in console.export_text() and "0 <=" not in console.export_text()
