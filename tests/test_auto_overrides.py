"""The dispatch rule's overrides beyond `feature >= threshold` over the whole axis (schema
logitreplay.dispatch/2): `feature < threshold`, an override held to part of the axis, the fit that finds
them with the intervals fitted on the cases the overrides leave, and the `crowding` feature."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from logitreplay.archive import Case
from logitreplay.errors import SelectorError
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.recommend import MIN_GAP, NEAR_BEST, _thresholds, evaluate, fit_rule
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult
from logitreplay.selectors.auto import SCHEMA, DispatchRule, Interval, Override, Scope
from logitreplay.selectors.features import FEATURES, PARTS, features

NAMES = ["native", "deepselect", "split"]


def _case(cid: str, rows: int, cols: int, times: Mapping[str, float], kind: str = "prefill",
          dtype: str = "float32") -> CaseResult:
    case = CaseResult(cid, rows, cols, 512, dtype, cols, "normal", rows * cols * 4, kind=kind)
    case.results = [SelectorResult(n, "ok", timing=Timing([t])) for n, t in times.items()]
    return case


def _result(*cases: CaseResult) -> ReplayResult:
    names = [r.selector for r in cases[0].results]
    return ReplayResult("cuda:0", "t", TimingProtocol(), {"gpu": "H200"}, names[0], names, list(cases))


def _rule(*overrides: Override, kind: str = "decode", selector: str = "split") -> DispatchRule:
    return DispatchRule(NAMES, [Scope("float32", kind, [Interval(0, None, selector)], overrides=list(overrides))],
                        selector)


def test_an_override_held_to_part_of_the_axis_decides_only_there_and_names_feature_and_span() -> None:
    rule = _rule(Override("fill", 0.16, "deepselect", lo=91))
    full = {"fill": 1.0}
    for rows in (1, 33, 90):
        assert rule.choose("float32", "decode", rows, 163840, full) == (
            "split", f"float32 decode, rows {rows}: all rows")
    for rows in (91, 256, 10**6):
        assert rule.choose("float32", "decode", rows, 163840, full) == (
            "deepselect", f"float32 decode, fill 1 >= 0.16, rows {rows}: rows >= 91")
    assert rule.choose("float32", "decode", 256, 163840, {"fill": 0.1})[0] == "split"  # below the threshold
    assert rule.choose("float32", "decode", 256, 163840)[0] == "split"  # no features: the interval alone
    below = _rule(Override("fill", 0.16, "deepselect", hi=91))
    assert below.choose("float32", "decode", 90, 163840, full)[1] == "float32 decode, fill 1 >= 0.16, rows 90: rows < 91"
    assert below.choose("float32", "decode", 91, 163840, full)[0] == "split"
    assert rule.describe()[1].startswith("  but deepselect where fill >= 0.16 and rows >= 91 (")


def test_a_below_override_takes_the_cases_under_its_threshold() -> None:
    rule = _rule(Override("fill", None, "native", below=0.4), kind="prefill", selector="deepselect")
    assert rule.choose("float32", "prefill", 1024, 16384, {"fill": 0.03}) == (
        "native", "float32 prefill, fill 0.03 < 0.4")
    assert rule.choose("float32", "prefill", 1024, 16384, {"fill": 0.4})[0] == "deepselect"  # at it: not below
    assert rule.describe()[1].startswith("  but native where fill < 0.4 (")
    with pytest.raises(ValueError, match="one of at_least and below"):
        Override("fill", 0.4, "native", below=0.5)
    with pytest.raises(ValueError, match="one of at_least and below"):
        Override("fill", None, "native")


def test_the_first_override_that_holds_decides() -> None:
    rule = _rule(Override("bin_load", 13.0, "deepselect"), Override("fill", None, "native", below=0.5))
    assert rule.choose("float32", "decode", 8, 163840, {"bin_load": 20.0, "fill": 0.1})[0] == "deepselect"
    assert rule.choose("float32", "decode", 8, 163840, {"bin_load": 1.0, "fill": 0.1})[0] == "native"


def test_schema_2_round_trips_and_schema_1_files_load_as_the_same_rule(tmp_path: Path) -> None:
    rule = _rule(Override("fill", None, "native", 2, ["a", "b"], below=0.4, lo=64, hi=512),
                 Override("bin_load", 13.0, "deepselect"))
    rule.save(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["schema"] == SCHEMA == "logitreplay.dispatch/2"
    assert DispatchRule.load(tmp_path / "r.json") == rule
    old = _rule(Override("bin_load", 13.0, "deepselect", 1, ["c"])).to_json()
    old["schema"] = "logitreplay.dispatch/1"
    for o in old["scopes"][0]["overrides"]:  # what a /1 file holds: no below, lo, hi
        del o["below"], o["lo"], o["hi"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    loaded = DispatchRule.load(tmp_path / "old.json")
    assert loaded.scopes[0].overrides == [Override("bin_load", 13.0, "deepselect", 1, ["c"])]
    assert loaded.choose("float32", "decode", 1, 163840, {"bin_load": 20.0})[0] == "deepselect"
    data["schema"] = "logitreplay.dispatch/3"
    (tmp_path / "new.json").write_text(json.dumps(data))
    with pytest.raises(SelectorError, match="dispatch/3"):
        DispatchRule.load(tmp_path / "new.json")
    data["schema"] = SCHEMA
    data["scopes"][0]["overrides"][0]["at_least"] = 0.1  # both directions at once
    (tmp_path / "both.json").write_text(json.dumps(data))
    with pytest.raises(SelectorError, match="one of at_least and below"):
        DispatchRule.load(tmp_path / "both.json")


def _flooded_decode() -> tuple[ReplayResult, dict[str, dict[str, float]]]:
    """Decode cases where a feature alone cannot decide: full rows (fill 1) favour deepselect in a batch of
    256 rows and split in one of 33; short rows favour split at both."""
    cases, feats = [], {}
    for rows in (33, 256):
        for i, fill in enumerate((0.05, 0.07, 0.09)):
            cid = f"short-{rows}-{i}"
            cases.append(_case(cid, rows, 163840, {"native": 300, "deepselect": 200, "split": 100}, "decode"))
            feats[cid] = {"fill": fill, "bin_load": 0.05}
        cid = f"full-{rows}"
        full = {"native": 500, "deepselect": 400 if rows == 33 else 100, "split": 100 if rows == 33 else 130}
        cases.append(_case(cid, rows, 163840, full, "decode"))
        feats[cid] = {"fill": 1.0, "bin_load": 8.0}
    return _result(*cases), feats


def test_the_fit_holds_an_override_to_the_part_of_the_axis_where_it_helps() -> None:
    result, feats = _flooded_decode()
    rule = fit_rule(result, case_features=feats)
    (scope,) = rule.scopes
    assert [(i.lo, i.hi, i.selector) for i in scope.intervals] == [(0, None, "split")]
    (o,) = scope.overrides
    assert o.selector == "deepselect" and o.cases == ["full-256"] and o.gained == 1
    assert o.hi is None and 33 < o.lo <= 256  # between the two measured batches
    chosen, why = rule.choose("float32", "decode", 256, 163840, feats["full-256"])
    assert chosen == "deepselect" and o.feature in why and f"rows 256: rows >= {o.lo}" in why
    assert rule.choose("float32", "decode", 33, 163840, feats["full-33"])[0] == "split"
    assert all(e.ratio == pytest.approx(1.0) for e in evaluate(rule, result, feats))


def test_the_fit_prefers_an_override_over_the_whole_axis_where_one_helps() -> None:
    result, feats = _flooded_decode()
    feats["full-256"]["crowding"] = 5.0  # now a feature tells the one case apart everywhere
    for cid in feats:
        feats[cid].setdefault("crowding", 1.1)
    (o,) = fit_rule(result, case_features=feats).scopes[0].overrides
    assert (o.feature, o.lo, o.hi, o.selector) == ("crowding", 0, None, "deepselect")
    assert 1.1 < (o.at_least or 0) <= 5.0


def test_the_fit_finds_a_below_override() -> None:
    cases = [_case(f"n{i}", 1024, 16384, {"native": 110, "deepselect": 100}) for i in range(3)]
    cases += [_case("edges", 1024, 16384, {"native": 50, "deepselect": 70}),
              _case("chunk", 1024, 16384, {"native": 60, "deepselect": 80})]
    feats = {c.case_id: {"fill": 0.97} for c in cases} | {"edges": {"fill": 0.03}, "chunk": {"fill": 0.32}}
    rule = fit_rule(_result(*cases), case_features=feats)
    assert rule.scopes[0].intervals[0].selector == "deepselect"
    (o,) = rule.scopes[0].overrides
    assert (o.feature, o.at_least, o.selector, sorted(o.cases)) == ("fill", None, "native", ["chunk", "edges"])
    assert o.below is not None and 0.32 < o.below <= 0.97
    assert rule.choose("float32", "prefill", 1024, 16384, feats["edges"])[1] == f"float32 prefill, fill 0.03 < {o.below:.3g}"


def test_intervals_are_fitted_on_the_cases_the_overrides_leave() -> None:
    """A width measured only on crowded rows (an indexer's) beside normal rows that favour deepselect
    around it: the width rule stays deepselect, and the crowding override takes the crowded cases."""
    normal = {"native": 130, "deepselect": 100}
    crowded = {"native": 100, "deepselect": 135}
    cases = [_case(f"n{w}-{i}", 1024, w, normal) for w in (16384, 65536) for i in range(2)]
    cases += [_case(f"x32k-{i}", 1024, 32768, crowded) for i in range(3)] + [_case("x64k", 1024, 65536, crowded)]
    feats = {c.case_id: {"crowding": 4.0 if c.case_id.startswith("x") else 1.1} for c in cases}
    width_only = fit_rule(_result(*cases))
    assert [i.selector for i in width_only.scopes[0].intervals] == ["deepselect", "native", "deepselect"]
    rule = fit_rule(_result(*cases), case_features=feats)
    (scope,) = rule.scopes
    assert [(i.lo, i.hi, i.selector) for i in scope.intervals] == [(0, None, "deepselect")]
    (o,) = scope.overrides
    assert (o.feature, o.selector, o.lo, o.hi) == ("crowding", "native", 0, None)
    assert sorted(o.cases) == ["x32k-0", "x32k-1", "x32k-2", "x64k"]
    assert all(e.ratio == pytest.approx(1.0) for e in evaluate(rule, _result(*cases), feats))


def test_on_random_measurements_each_override_improves_on_the_width_rule_alone() -> None:
    """Whatever the fit finds: with its overrides the rule has more cases within 3% than the width rule
    fitted on every case, or as many and a better worst case above 3% (each override is kept only so);
    each override's cases are the ones it decides; no threshold sits between values closer than MIN_GAP."""
    gen = torch.Generator().manual_seed(7)
    found = 0
    for _ in range(20):
        cases, feats = [], {}
        for i in range(12):
            rows = int(torch.randint(1, 512, (1,), generator=gen))
            t = (torch.rand(3, generator=gen) * 100 + 10).tolist()
            cid = f"c{i}"
            cases.append(_case(cid, rows, 163840, dict(zip(NAMES, t, strict=True)), "decode"))
            feats[cid] = {"fill": float(torch.rand(1, generator=gen)), "bin_load": float(torch.rand(1, generator=gen)) * 10}
        result = _result(*cases)
        rule = fit_rule(result, case_features=feats)
        width = fit_rule(result)
        (scope,) = rule.scopes
        found += len(scope.overrides)
        assert _summary(rule, result, feats) >= _summary(width, result, {})
        if scope.overrides:
            assert _summary(rule, result, feats) > _summary(width, result, {})
        taken: set[str] = set()
        for o in scope.overrides:
            values = sorted({f[o.feature] for f in feats.values()})
            threshold = o.at_least if o.at_least is not None else o.below
            assert threshold is not None
            lower = max(v for v in values if v < threshold)
            upper = min(v for v in values if v >= threshold)
            assert upper >= MIN_GAP * lower or lower <= 0
            decides = [c.case_id for c in cases if c.case_id not in taken
                       and o.holds(c.rows, feats[c.case_id].get(o.feature))]
            assert o.cases == decides
            taken |= set(decides)
    assert found  # the random draws do give the fit something to find


def _summary(rule: DispatchRule, result: ReplayResult, feats: dict[str, dict[str, float]]) -> tuple[int, float]:
    """(cases within 3%, -worst ratio, NEAR_BEST at least): what each override must improve."""
    ratios = [e.ratio for e in evaluate(rule, result, feats) if e.ratio is not None]
    return sum(x <= NEAR_BEST for x in ratios), -max(*ratios, NEAR_BEST)


def test_thresholds_skip_values_closer_than_the_gap() -> None:
    assert _thresholds([1.0, 1.1, 4.0], MIN_GAP) == [2.1]  # only between 1.1 and 4 (geometric middle)
    assert _thresholds([0.0, 0.5], MIN_GAP) == [0.25]  # from zero: any gap
    assert len(_thresholds([1.0, 1.1, 4.0])) == 2


def test_crowding_is_about_one_on_spread_scores_and_high_where_the_top_sits_at_the_row_end() -> None:
    assert "crowding" in FEATURES
    gen = torch.Generator().manual_seed(0)
    spread = torch.randn(16, 8192, generator=gen)
    starts, ends = torch.zeros(16, dtype=torch.int32), torch.full((16,), 8192, dtype=torch.int32)
    even = features(Case.from_matrix("spread", spread, starts, ends, top_k=256))["crowding"]
    assert 1.0 <= even < 1.5
    recent = spread + torch.linspace(0, 4, 8192)  # later keys score higher, as an indexer's recency does
    late = features(Case.from_matrix("recent", recent, starts, ends, top_k=256))["crowding"]
    assert late > 3 and late <= PARTS
    short = features(Case.from_matrix("short", spread, starts, torch.full((16,), 100, dtype=torch.int32), top_k=256))
    assert short["crowding"] == 0.0 and short["bin_load"] == 0.0  # rows no longer than top_k say nothing
