"""`replay --recommend`: from measured cases, the logits width at which one selector overtakes another.

The published analysis of DeepSelect against native concluded that an automatic dispatch must depend on
the actual logits width, so this turns a replay into that rule instead of a guess. Per pair of timed
selectors (and per dtype), the time ratio is taken per distinct width (`cols`; the geometric mean over
cases of that width, whatever their distribution, so a width is judged on everything replayed there);
wherever the ratio crosses 1 between two neighbouring widths, the crossover is interpolated linearly in
log(width) vs log(ratio), and the cases at both bounding widths are named. When the cases come from
several sources (distributions, models and layers), each source measured at two or more widths also gets
its own rule: a distribution that only exists at one width (e.g. concentrated scores) would otherwise
bend the all-cases rule there.

`fit_rule` turns the same measurements into the dispatch artifact `auto` runs (`selectors/auto.py`):
per dtype and kind, each measured width (rows, for decode) goes to the selector that is within 3% of the fastest on the
most cases of that width (ties: the lowest geometric mean time), so a width holding one adversarial
distribution beside several ordinary ones follows the ordinary ones, and the adversarial one is
listed where it overturns the rule. Neighbouring widths with one winner merge into one interval; a
boundary sits at the interpolated crossing of the two winners (log width vs log ratio), with the cases
and the margins (median over the cases there of loser / winner) at both bounding widths.

Given each case's distribution features (`selectors/features.py`), the fit then adds overrides to each
scope, greedily, up to `MAX_OVERRIDES`: each step takes the override (feature, `>=` or `<` a threshold,
selector, and the part of the axis it holds on) that most improves the scope's score (cases within 3% of
their fastest, then the worst ratio, counted only above 3%; ties: fewer moved cases that were within 3%
already, then fewer winner changes along the axis, then the geometric mean ratio), and it must bring
more cases within 3% or a better worst case, and never move a case to a selector more than 3% slower
than the one the rule gave it. An override over the whole axis is taken where one helps; one above or
below a cut between measured positions ("fill >= 0.16 and rows >= 91") only where none does. The
intervals are fitted together with the overrides: each override is weighed with the intervals fitted
again on the cases no override holds on, since a width measured only on one distribution (an indexer's
recency beside normal scores elsewhere) would otherwise turn the width rule there, and the final
intervals, boundaries and overturns are those of the cases the overrides leave.

Thresholds lie between two measured feature values at least `MIN_GAP` apart (their geometric middle,
rounded), so a rule never claims a threshold no measured case bounds, nor one a resampling of rows
could cross; of the thresholds and cuts that move the same cases, the middle one is kept.
"""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from logitreplay.errors import DecisionError
from logitreplay.replay.compare import AutoScore
from logitreplay.replay.results import CaseResult, ReplayResult
from logitreplay.selectors.auto import (
    Boundary,
    Crossover,
    DispatchRule,
    Interval,
    Override,
    Overturn,
    Scope,
    position,
)

# A selector within this factor of a case's fastest counts as as good as the fastest there.
NEAR_BEST = 1.03
MAX_OVERRIDES = 3
# A feature threshold sits between two measured values at least this far apart: the features come from
# a sample of rows, and a threshold closer than about 10% to a measured case is one resampling from
# deciding it the other way.
MIN_GAP = 1.25
Features = dict[str, dict[str, float]]  # case id -> feature -> value


@dataclass
class PairRule:
    """One selector pair on one dtype: `ratios[w]` = time(a) / time(b) at width w, the crossovers, and
    the rule in words."""

    a: str
    b: str
    dtype: str
    ratios: dict[int, float]
    crossovers: list[Crossover] = field(default_factory=list)
    rule: str = ""
    source: str | None = None  # None: every case of the dtype; else only the cases of this source
    # Decode cases are all max_model_len wide: their rule runs over rows (batch x next_n), the number
    # vLLM's own decode dispatch looks at (cooperative_topk up to 64 rows), and never mixes with prefill.
    kind: str = "prefill"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["ratios"] = {str(w): r for w, r in self.ratios.items()}
        return d


def recommend(result: ReplayResult) -> list[PairRule]:
    """A rule for every pair of selectors that were both timed on cases of at least one common width,
    per dtype, then per source (see the module docstring)."""
    rules = []
    for dtype, kind in sorted({(c.dtype, c.kind) for c in result.cases}):
        cases = [c for c in result.cases if (c.dtype, c.kind) == (dtype, kind) and not c.invalid]
        sources = sorted({c.source for c in cases})
        groups: list[tuple[str | None, list[CaseResult]]] = [(None, cases)]
        if len(sources) > 1:
            for source in sources:
                mine = [c for c in cases if c.source == source]
                if len({_position(c) for c in mine}) > 1:
                    groups.append((source, mine))
        for scope, group in groups:
            for a, b in itertools.combinations(result.selectors, 2):
                rule = _pair_rule(group, a, b, dtype, scope, kind)
                if rule is not None:
                    rules.append(rule)
    return rules


def _position(case: CaseResult) -> int:
    """Where a case sits on its rule's axis: rows for a decode case, the logits width otherwise."""
    return position(case.kind, case.rows, case.cols)


def _pair_rule(cases: list[CaseResult], a: str, b: str, dtype: str, source: str | None,
               kind: str = "prefill") -> PairRule | None:
    logs: dict[int, list[float]] = {}
    names: dict[int, list[str]] = {}
    for case in cases:
        ta, tb = case.timed(a), case.timed(b)
        if ta is None or tb is None or ta.median_us <= 0 or tb.median_us <= 0:
            continue
        logs.setdefault(_position(case), []).append(math.log(ta.median_us / tb.median_us))
        names.setdefault(_position(case), []).append(case.case_id)
    if not logs:
        return None
    widths = sorted(logs)
    y = {w: sum(v) / len(v) for w, v in logs.items()}
    pair = PairRule(a, b, dtype, {w: math.exp(y[w]) for w in widths}, source=source, kind=kind)
    for w0, w1 in itertools.pairwise(widths):
        if (y[w0] < 0) != (y[w1] < 0) and y[w0] != y[w1]:
            t = -y[w0] / (y[w1] - y[w0])
            width = math.exp(math.log(w0) + t * (math.log(w1) - math.log(w0)))
            faster_below, faster_above = (a, b) if y[w0] < 0 else (b, a)
            pair.crossovers.append(Crossover(width, faster_below, faster_above, w0, w1, names[w0], names[w1]))
    pair.rule = _rule(pair, widths, y)
    return pair


def _rule(pair: PairRule, widths: list[int], y: dict[int, float]) -> str:
    decode = pair.kind == "decode"
    dtype = f"{pair.dtype} decode" if decode else pair.dtype
    scope = dtype if pair.source is None else f"{dtype} [{pair.source} only]"
    axis, unit, where = ("rows", "rows", "row count") if decode else ("cols", "columns", "width")
    span = f"{widths[0]}-{widths[-1]} {unit}" if len(widths) > 1 else f"{widths[0]} {unit}"
    if not pair.crossovers:
        faster = pair.a if y[widths[0]] < 0 else pair.b
        return f"{scope}: {faster} faster than {pair.b if faster == pair.a else pair.a} at every measured {where} ({span})"
    parts = []
    first = pair.crossovers[0]
    parts.append(f"{first.below} when {axis} < {first.width:.0f}")
    for prev, cur in itertools.pairwise(pair.crossovers):
        parts.append(f"{prev.above} for {prev.width:.0f} <= {axis} < {cur.width:.0f}")
    last = pair.crossovers[-1]
    parts.append(f"{last.above} when {axis} >= {last.width:.0f}")
    # The bounding cases are in the JSON (`lower_cases`, `upper_cases`): listed here they made one rule
    # several lines long.
    bounds = "; ".join(f"between {c.lower_width} and {c.upper_width}" for c in pair.crossovers)
    return f"{scope}, {pair.a} vs {pair.b}: " + ", ".join(parts) + f" [{bounds}]"


def fit_rule(result: ReplayResult, candidates: list[str] | None = None,
             case_features: Features | None = None) -> DispatchRule:
    """The dispatch rule over `candidates` (default: every selector but `auto`), per dtype and kind,
    from the valid cases every candidate was timed on, with overrides where `case_features` (per case
    id) are given (see the module docstring)."""
    names = [s for s in (candidates or result.selectors) if s != "auto"]
    cases = [c for c in result.cases if not c.invalid and all(c.timed(s) for s in names)]
    if len(names) < 1 or not cases:
        raise DecisionError(f"no case was timed on every one of {', '.join(names) or 'no selectors'}; nothing "
                            "to fit a dispatch rule on")
    scopes = []
    for dtype, kind in sorted({(c.dtype, c.kind) for c in cases}):
        mine = [c for c in cases if (c.dtype, c.kind) == (dtype, kind)]
        scopes.append(_fit_scope_and_overrides(mine, names, dtype, kind, case_features))
    default = _best(cases, names)
    return DispatchRule(names, scopes, default, {"device": result.device, "gpu": result.environment.get("gpu"),
                                                 "inputs": result.environment.get("inputs"),
                                                 "protocol": result.protocol.to_json(), "cases": len(cases)})


def _median(case: CaseResult, selector: str) -> float:
    timing = case.timed(selector)
    assert timing is not None
    return max(timing.median_us, 1e-9)


def _best(cases: list[CaseResult], names: list[str]) -> str:
    """The selector within NEAR_BEST of the fastest on the most cases; ties: lowest geometric mean."""
    return _winner([{n: _median(c, n) for n in names} for c in cases], names)


def _winner(times: list[dict[str, float]], names: list[str]) -> str:
    """`_best` on the cases' median times (per case: selector -> time)."""
    def score(name: str) -> tuple[int, float]:
        near = sum(t[name] <= NEAR_BEST * min(t[n] for n in names) for t in times)
        return -near, sum(math.log(t[name]) for t in times)

    return min(names, key=score)


def _log_ratio(cases: list[CaseResult], a: str, b: str) -> float:
    """The median over cases of log(time a / time b): robust to the one adversarial case a width may hold,
    like the winner chosen by most cases."""
    return statistics.median(math.log(_median(c, a) / _median(c, b)) for c in cases)


def _geomean(cases: list[CaseResult], name: str) -> float:
    return math.exp(sum(math.log(_median(c, name)) for c in cases) / len(cases))


def _fit_scope(cases: list[CaseResult], names: list[str], dtype: str, kind: str) -> Scope:
    by_width: dict[int, list[CaseResult]] = {}  # by position on the scope's axis: width, or rows (decode)
    for case in cases:
        by_width.setdefault(position(case.kind, case.rows, case.cols), []).append(case)
    widths = sorted(by_width)
    best = {w: _best(by_width[w], names) for w in widths}
    scope = Scope(dtype, kind, [])
    lower = 0
    for w0, w1 in itertools.pairwise(widths):
        a, b = best[w0], best[w1]
        if a == b:
            continue
        at0, at1 = by_width[w0], by_width[w1]
        y0, y1 = _log_ratio(at0, a, b), _log_ratio(at1, a, b)
        t = 0.5 if y1 == y0 else min(1.0, max(0.0, -y0 / (y1 - y0)))
        width = math.exp(math.log(w0) + t * (math.log(w1) - math.log(w0)))
        scope.boundaries.append(Boundary(width, a, b, w0, w1, [c.case_id for c in at0], [c.case_id for c in at1],
                                         math.exp(-y0), math.exp(y1)))
        upper = max(w0 + 1, min(w1, round(width)))
        scope.intervals.append(Interval(lower, upper, a))
        lower = upper
    scope.intervals.append(Interval(lower, None, best[widths[-1]]))
    for w in widths:
        for source in sorted({c.source for c in by_width[w]}):
            mine = [c for c in by_width[w] if c.source == source]
            if len(mine) == len(by_width[w]):
                continue  # the width's only source: it is the rule there, not an exception to it
            faster = _best(mine, names)
            margin = _geomean(mine, best[w]) / _geomean(mine, faster)
            if faster != best[w] and margin > NEAR_BEST:
                scope.overturned.append(Overturn(source, w, best[w], faster, margin, [c.case_id for c in mine]))
    return scope


def ratio_to_best(case: CaseResult, chosen: str, names: list[str]) -> float:
    """time(chosen) / time(fastest of names) on a case where all were timed (>= 1)."""
    return _median(case, chosen) / min(_median(case, n) for n in names)


def score(rule: DispatchRule, cases: list[CaseResult], names: list[str],
          case_features: Features) -> tuple[int, float, float]:
    """(cases within NEAR_BEST of their fastest, -worst ratio, -sum of log ratios): larger is better."""
    ratios = [ratio_to_best(c, rule.choose(c.dtype, c.kind, c.rows, c.cols, case_features.get(c.case_id))[0], names)
              for c in cases]
    return sum(r <= NEAR_BEST for r in ratios), -max(ratios), -sum(math.log(r) for r in ratios)


def _thresholds(values: list[float], gap: float = 1.0) -> list[float]:
    """A threshold between each two neighbouring measured values at least `gap` times apart: their
    geometric middle (arithmetic where the lower is not positive), rounded to 2 significant digits when
    that stays between them."""
    out = []
    for a, b in itertools.pairwise(sorted(set(values))):
        if a > 0 and b < gap * a:
            continue
        mid = math.sqrt(a * b) if a > 0 else (a + b) / 2
        short = float(f"{mid:.2g}")
        out.append(short if a < short <= b else mid)
    return out


def _cuts(positions: list[int]) -> list[int]:
    """A whole-number cut between each two neighbouring measured positions (rows or columns), from
    `_thresholds`: `lo <= position` holds above the cut and not below it."""
    out = []
    for a, b in itertools.pairwise(sorted(set(positions))):
        t = _thresholds([a, b])[0]
        out.append(round(t) if a < round(t) <= b else math.ceil(t))
    return out


def _candidates(cases: list[CaseResult], names: list[str], case_features: Features) -> list[Override]:
    """Every override the fit weighs, the simplest first (ties go to the first): over the whole axis,
    then above or below each cut between measured positions; per feature, each threshold between two
    values measured on that part of the axis, `>=` then `<`, per selector."""
    feats = sorted({f for c in cases for f in case_features[c.case_id]})
    at = {c.case_id: position(c.kind, c.rows, c.cols) for c in cases}
    cuts = _cuts(list(at.values()))
    spans: list[tuple[int, int | None]] = [(0, None), *((t, None) for t in cuts), *((0, t) for t in cuts)]
    out = []
    for lo, hi in spans:
        inside = [c for c in cases if lo <= at[c.case_id] and (hi is None or at[c.case_id] < hi)]
        for feature in feats:
            values = [case_features[c.case_id][feature] for c in inside if feature in case_features[c.case_id]]
            for t in _thresholds(values, MIN_GAP):
                for name in names:
                    out.append(Override(feature, t, name, lo=lo, hi=hi))
                    out.append(Override(feature, None, name, below=t, lo=lo, hi=hi))
    return out


def _family(o: Override) -> tuple[str, bool, str, bool, bool]:
    """What two overrides share when they differ only in where their threshold and cut sit."""
    return o.feature, o.at_least is None, o.selector, o.lo > 0, o.hi is not None


def _fit_scope_and_overrides(cases: list[CaseResult], names: list[str], dtype: str, kind: str,
                             case_features: Features | None) -> Scope:
    """The scope's intervals and overrides, fitted together (module docstring): each override is
    weighed with the intervals fitted again on the cases no override holds on."""
    feats = case_features or {}
    known = [c for c in cases if c.case_id in feats]
    if not known:
        return _fit_scope(cases, names, dtype, kind)
    times = [{n: _median(c, n) for n in names} for c in known]
    ratios = [{n: t[n] / min(t.values()) for n in names} for t in times]
    at = [position(c.kind, c.rows, c.cols) for c in known]
    candidates = _candidates(known, names, feats)
    takes = [[i for i, c in enumerate(known) if o.holds(at[i], feats[c.case_id].get(o.feature))] for o in candidates]
    overrides: list[Override] = []
    owner: list[str | None] = [None] * len(known)  # the selector of the override that holds on a case

    def rank(held: list[str | None]) -> tuple[tuple[int, float, float, int], list[str]]:
        """(cases within 3%, -worst ratio (NEAR_BEST at least), -sum of log ratios, -winner changes along the
        axis) and each case's choice: `held` ones by their override, the rest by the intervals fitted on
        the rest (every measured position goes to its own winner, `_fit_scope`)."""
        left: dict[int, list[dict[str, float]]] = {}
        for i, h in enumerate(held):
            if h is None:
                left.setdefault(at[i], []).append(times[i])
        best = {w: _winner(left[w], names) for w in sorted(left)}
        chosen = [h if h is not None else best[at[i]] for i, h in enumerate(held)]
        r = [ratios[i][n] for i, n in enumerate(chosen)]
        changes = sum(a != b for a, b in itertools.pairwise(best.values()))
        # a worst case within 3% is as good as none: an override is not worth a 1% gain on one case
        return (sum(x <= NEAR_BEST for x in r), -max(*r, NEAR_BEST), -sum(math.log(x) for x in r), -changes), chosen

    for _ in range(MAX_OVERRIDES):
        now, chosen = rank(owner)
        found: list[tuple[tuple[int, int, float, int, float], int, frozenset[int]]] = []
        for j, o in enumerate(candidates):
            held = [i for i in takes[j] if owner[i] is None]
            moved = [i for i in held if chosen[i] != o.selector]
            # a case it moves must not end more than 3% slower than where the rule had it
            if not moved or any(ratios[i][o.selector] > NEAR_BEST * ratios[i][chosen[i]] for i in moved):
                continue
            trial = list(owner)
            for i in held:
                trial[i] = o.selector
            got, _ = rank(trial)
            if got[:2] > now[:2]:  # more cases within 3%, or a better worst case: not the mean alone
                # ties: fewer moved cases that were within 3% already (nothing to gain there), then the
                # better worst case, fewer winner changes along the axis, the better mean
                idle = sum(ratios[i][chosen[i]] <= NEAR_BEST for i in moved)
                found.append(((got[0], -idle, got[1], got[3], got[2]), j, frozenset(moved)))
        if not found:
            break
        # an override over the whole axis where one helps; one on part of it only where none does
        whole = [f for f in found if candidates[f[1]].span("") is None]
        top, j, top_moved = max(whole or found, key=lambda f: (f[0], -f[1]))
        # Of the overrides that move the same cases the same way, the middle one: its threshold and cut
        # sit as far from the measured cases on either side as that family allows.
        same = [k for r, k, m in found
                if r == top and m == top_moved and _family(candidates[k]) == _family(candidates[j])]
        k = same[len(same) // 2]
        override = candidates[k]
        override.gained = top[0] - now[0]
        override.cases = [known[i].case_id for i in takes[k] if owner[i] is None]
        overrides.append(override)
        for i in takes[k]:
            if owner[i] is None:
                owner[i] = override.selector
    held_ids = {known[i].case_id for i, h in enumerate(owner) if h is not None}
    scope = _fit_scope([c for c in cases if c.case_id not in held_ids] or cases, names, dtype, kind)
    scope.overrides = overrides
    return scope


def fit_reports(results: list[ReplayResult], candidates: list[str], case_features: Features) -> DispatchRule:
    """One rule from several replays whose selectors differ (a prefill suite without `split`, decode suites
    with it): per dtype and kind, over the candidates that cover the most of its cases (then the most
    candidates), fitted with overrides on `case_features`. The default is the largest scope's."""
    cases = [c for r in results for c in r.cases if not c.invalid]
    scopes: list[Scope] = []
    used: list[str] = []
    largest: tuple[int, str] = (0, candidates[0])
    for dtype, kind in sorted({(c.dtype, c.kind) for c in cases}):
        mine = [c for c in cases if (c.dtype, c.kind) == (dtype, kind)]
        subsets = [list(s) for n in range(len(candidates), 0, -1) for s in itertools.combinations(candidates, n)]
        names = max(subsets, key=lambda s: (sum(all(c.timed(n) for n in s) for c in mine), len(s)))
        covered = [c for c in mine if all(c.timed(n) for n in names)]
        if not covered:
            continue
        scope = _fit_scope_and_overrides(covered, names, dtype, kind, case_features)
        scopes.append(scope)
        used += [n for n in names if n not in used]
        largest = max(largest, (len(covered), _best(covered, names)))
    if not scopes:
        raise DecisionError(f"no case was timed on any of {', '.join(candidates)}; nothing to fit a dispatch rule on")
    first = results[0]
    return DispatchRule(used, scopes, largest[1], {
        "device": first.device, "gpu": first.environment.get("gpu"),
        "inputs": [i for r in results for i in r.environment.get("inputs") or []],
        "protocol": first.protocol.to_json(), "cases": sum(len(c.cases) for c in results)})


@dataclass
class Evaluated:
    """The rule on one measured case: what it chose and why, and chosen / fastest (None: the chosen
    selector was not timed there); `width_ratio` the same for the width rule alone."""

    case_id: str
    chosen: str
    why: str
    ratio: float | None
    width_ratio: float | None


def evaluate(rule: DispatchRule, result: ReplayResult, case_features: Features) -> list[Evaluated]:
    """The rule replayed on a report's measurements, case by case, against the fastest of its selectors
    timed on each case."""
    out = []
    for c in result.cases:
        names = [n for n in rule.selectors if c.timed(n)]
        if c.invalid or not names:
            continue
        chosen, why = rule.choose(c.dtype, c.kind, c.rows, c.cols, case_features.get(c.case_id))
        width = rule.choose(c.dtype, c.kind, c.rows, c.cols)[0]
        out.append(Evaluated(c.case_id, chosen, why, ratio_to_best(c, chosen, names) if chosen in names else None,
                             ratio_to_best(c, width, names) if width in names else None))
    return out


def auto_summary(score: AutoScore) -> str:
    """`within 3% on 8 of 12 cases (67%); worst 1.39x (case)`: worst is the largest ratio of auto's time to
    the per-case fastest. A ratio below 1 (auto timed faster than the selector it ran: noise) is no one's
    worst case, so a run whose every ratio is below 1 says that instead."""
    head = f"within 3% on {score.within} of {score.cases} cases ({score.within / score.cases:.0%}); "
    worst = score.worst_ratio or 0.0
    if worst < 1:
        return head + f"never slower than the fastest (largest ratio {worst:.2f}x, {score.worst_case})"
    return head + f"worst {worst:.2f}x ({score.worst_case})"


def rule_device_mismatch(rule: DispatchRule, device: str) -> str | None:
    """Why a rule measured on one kind of device (the CPU models' wall clock, or a GPU's kernels) says
    nothing about the other it dispatches on, or None when both are the same kind."""
    fitted = str(rule.fitted_on.get("device") or "")
    if not fitted or fitted.split(":")[0] == device.split(":")[0]:
        return None
    where = "the CPU models' wall clock" if fitted.startswith("cpu") else f"{fitted} ({rule.fitted_on.get('gpu')})"
    return (f"the dispatch rule was fitted on {where} and is applied on {device}: its choices are not "
            "measurements of this device (fit one here with --rule-out)")
