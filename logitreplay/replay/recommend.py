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
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from logitreplay.replay.results import CaseResult, ReplayResult
from logitreplay.selectors.auto import position


@dataclass
class Crossover:
    """Between `lower_width` and `upper_width` columns (rows, for decode cases) the faster selector
    changes from `below` to `above`; `width` is the interpolated crossing, `lower_cases` / `upper_cases`
    the bounding cases."""

    width: float
    below: str
    above: str
    lower_width: int
    upper_width: int
    lower_cases: list[str]
    upper_cases: list[str]


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
