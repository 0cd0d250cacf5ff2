"""The dispatch rule as an artifact, and `auto`: a selector that dispatches each case by that rule.

`replay --recommend --rule-out RULE.json` measures the rule (`replay/recommend.py` fits it); this module
defines its file format, once, because selectors cannot import replay. A rule holds, per dtype and kind
(prefill / decode), intervals `[lo, hi)` of its axis -> selector (the axis is the logits width for
prefill, and the rows, batch x next_n, for decode: every decode case is max_model_len wide, and rows are
what vLLM's own decode dispatch looks at), the boundaries between them with
the cases and margins measured on both sides, and the places where one distribution overturns the width
rule (a faster selector there than the interval names). `auto` dispatches on what serving can see at
dispatch time, dtype, kind and width, and then on the distribution features of the case's rows
(`selectors/features.py`, computed from a sample of rows) where the fit found a feature that moves
cases to a faster selector: each scope's `overrides`, taken in order, the first that holds deciding.
An override is one feature against one threshold, `feature >= at_least` or `feature < below`, and may
hold only on part of the axis (`lo <= position < hi`, like an interval: "fill >= 0.16 and rows >= 91").
Every choice names what decided it: the width (rows) interval, or the feature and its value. An
overturn is a note in the artifact, not a dispatch input.

Schema `logitreplay.dispatch/2` added the override's `below`, `lo` and `hi`; a `/1` file (overrides of
`at_least` over the whole axis) is read as the same rule.

The kind is what the case shows: its `kind` label where it has one, else the kind its bounds show
(`archive/shape.py`: a prefill chunk's ends climb by one per row, a decode batch's rows are few and
independent across a wide matrix, MTP rows step by one in groups of next_n), so an unlabeled decode
batch (`Case.from_matrix`, a safetensors import, a tool that does not label) is dispatched as its
labelled twin is; the choice's `why` says when the kind was inferred, or when a label contradicts the
bounds.

`--selectors auto --rule RULE.json` builds `auto` through the registry like any selector: the command
puts the rule's path in `LOGITREPLAY_DISPATCH_RULE` (so isolated children find it too), and the factory
builds the named selectors. Each case's choice is kept in `choices` and reported.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from logitreplay.archive import Case
from logitreplay.archive.shape import kind_for
from logitreplay.errors import SelectorError
from logitreplay.selectors.base import Launch, Selector
from logitreplay.selectors.features import features

SCHEMA = "logitreplay.dispatch/2"
READS = (SCHEMA, "logitreplay.dispatch/1")  # /1: overrides without below, lo, hi
RULE_ENV = "LOGITREPLAY_DISPATCH_RULE"


def position(kind: str, rows: int, cols: int) -> int:
    """Where a case sits on its rule's axis: rows for a decode case, the logits width otherwise."""
    return rows if kind == "decode" else cols


def axis(kind: str) -> str:
    return "rows" if kind == "decode" else "cols"


@dataclass
class Interval:
    """Cases of `lo <= position < hi` (None: no upper end) go to `selector`."""

    lo: int
    hi: int | None
    selector: str

    def span(self, name: str) -> str:
        """The interval in words: `all cols`, `cols < 8192`, `cols >= 8192`, `4096 <= cols < 8192`."""
        if self.lo <= 0:
            return f"all {name}" if self.hi is None else f"{name} < {self.hi}"
        return f"{name} >= {self.lo}" if self.hi is None else f"{self.lo} <= {name} < {self.hi}"


@dataclass
class Override:
    """Cases whose `feature` is at least `at_least` (or, with `below` instead, less than `below`) go to
    `selector`, whatever their interval, where their position on the axis is in `[lo, hi)` (the whole
    axis by default). `cases`: the fitted cases it decides (those no earlier override took); `gained`:
    how many more fitted cases it brought within 3% of their fastest."""

    feature: str
    at_least: float | None
    selector: str
    gained: int = 0
    cases: list[str] = field(default_factory=list)
    below: float | None = None
    lo: int = 0
    hi: int | None = None

    def __post_init__(self) -> None:
        if (self.at_least is None) == (self.below is None):
            raise ValueError(f"override on {self.feature}: give one of at_least and below")

    def holds(self, at: int, value: float | None) -> bool:
        """Whether it decides a case at axis position `at` with this feature value (None: not known)."""
        if value is None or at < self.lo or (self.hi is not None and at >= self.hi):
            return False
        if self.at_least is not None:
            return value >= self.at_least
        return self.below is not None and value < self.below

    def test(self, value: float | None = None) -> str:
        """The feature test in words, with the case's value when given: `fill 0.2 >= 0.16`."""
        seen = self.feature if value is None else f"{self.feature} {value:.3g}"
        return f"{seen} >= {self.at_least:.3g}" if self.at_least is not None else f"{seen} < {self.below:.3g}"

    def span(self, name: str) -> str | None:
        """The part of the axis it holds on, in words (`rows >= 91`), or None for the whole axis."""
        return None if self.lo <= 0 and self.hi is None else Interval(self.lo, self.hi, self.selector).span(name)


@dataclass
class Crossover:
    """Between `lower_width` and `upper_width` (columns; rows for decode cases) the faster selector
    changes from `below` to `above`; `width` is the interpolated crossing, `lower_cases` /
    `upper_cases` the cases measured at the two bounding positions."""

    width: float
    below: str
    above: str
    lower_width: int
    upper_width: int
    lower_cases: list[str]
    upper_cases: list[str]


@dataclass
class Boundary(Crossover):
    """A crossover of a fitted rule, with each winner's margin there (the median over the cases at its
    bounding position of loser / winner)."""

    margin_below: float
    margin_above: float


@dataclass
class Overturn:
    """At `position`, cases of `source` run faster on `faster` than on the rule's `rule_selector`, by `margin`."""

    source: str
    position: int
    rule_selector: str
    faster: str
    margin: float
    cases: list[str]


@dataclass
class Scope:
    """The rule for one dtype and kind."""

    dtype: str
    kind: str
    intervals: list[Interval]
    boundaries: list[Boundary] = field(default_factory=list)
    overturned: list[Overturn] = field(default_factory=list)
    overrides: list[Override] = field(default_factory=list)


@dataclass
class DispatchRule:
    """The whole rule: the selectors it dispatches to, the scopes, a `default` for a dtype or kind it has
    no scope for (the fastest selector over every fitted case), and what it was fitted on."""

    selectors: list[str]
    scopes: list[Scope]
    default: str
    fitted_on: dict[str, Any] = field(default_factory=dict)

    @property
    def features(self) -> list[str]:
        """The distribution features some override looks at (none: the rule sees widths only)."""
        return sorted({o.feature for s in self.scopes for o in s.overrides})

    def choose(self, dtype: str, kind: str, rows: int, cols: int,
               case_features: dict[str, float] | None = None) -> tuple[str, str]:
        """(selector, why) for a case of this dtype, kind and shape and these distribution features
        (None: the width rule alone); `why` names what decided: the interval, or a feature and its value."""
        scope = next((s for s in self.scopes if s.dtype == dtype and s.kind == kind), None)
        if scope is None:
            return self.default, f"no rule for {dtype} {kind}: default {self.default}"
        at, name = position(kind, rows, cols), axis(kind)
        for o in scope.overrides:
            value = (case_features or {}).get(o.feature)
            if o.holds(at, value):
                span = o.span(name)
                return o.selector, f"{dtype} {kind}, {o.test(value)}" + (f", {name} {at}: {span}" if span else "")
        for iv in scope.intervals:
            if iv.lo <= at and (iv.hi is None or at < iv.hi):
                return iv.selector, f"{dtype} {kind}, {name} {at}: {iv.span(name)}"
        return self.default, f"no interval of {dtype} {kind} holds {name} {at}: default {self.default}"

    def describe(self) -> list[str]:
        """The rule in words, a line per scope, override, boundary and overturn (indented under its scope)."""
        lines = []
        for scope in self.scopes:
            name = axis(scope.kind)
            lines.append(f"rule {scope.dtype} {scope.kind}: "
                         + "; ".join(f"{iv.selector} for {iv.span(name)}" for iv in scope.intervals))
            lines += [f"  but {o.selector} where {o.test()}" + (f" and {o.span(name)}" if o.span(name) else "")
                      + f" (decides {len(o.cases)} fitted cases, {o.gained} more within 3%)" for o in scope.overrides]
            lines += [f"  boundary {b.width:.0f}: {b.below} {b.margin_below:.2f}x faster at {b.lower_width}, "
                      f"{b.above} {b.margin_above:.2f}x faster at {b.upper_width}" for b in scope.boundaries]
            lines += [f"  overturned at {name} {o.position} by {o.source}: {o.faster} {o.margin:.2f}x faster than "
                      f"{o.rule_selector} ({len(o.cases)} cases)" for o in scope.overturned]
        lines.append(f"default (a dtype or kind without a rule): {self.default}")
        return lines

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> DispatchRule:
        if d.get("schema") not in READS:
            raise ValueError(f"schema {d.get('schema')!r}, expected {SCHEMA!r}")
        scopes = [Scope(s["dtype"], s["kind"], [Interval(**i) for i in s["intervals"]],
                        [Boundary(**b) for b in s.get("boundaries", [])],
                        [Overturn(**o) for o in s.get("overturned", [])],
                        [Override(**o) for o in s.get("overrides", [])]) for s in d["scopes"]]
        rule = cls(list(d["selectors"]), scopes, str(d["default"]), dict(d.get("fitted_on", {})))
        named = ({rule.default} | {i.selector for s in scopes for i in s.intervals}
                 | {o.selector for s in scopes for o in s.overrides})
        if not named <= set(rule.selectors):
            raise ValueError(f"names selectors not in its list: {', '.join(sorted(named - set(rule.selectors)))}")
        return rule

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> DispatchRule:
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except OSError as e:
            raise SelectorError(f"dispatch rule {path}: cannot read ({e.strerror or e})") from None
        except (ValueError, KeyError, TypeError) as e:
            raise SelectorError(f"dispatch rule {path}: not a dispatch rule ({type(e).__name__}: {e})") from None


class AutoSelector:
    """Dispatches each case to the selector its rule names; `choices[case_id]` = (selector, why).

    `supports` makes the choice (it is the only call that sees the case: the features are computed there,
    untimed, only when the rule has overrides) and `prepare` delegates to the chosen selector, so the
    timed launch is that selector's own launch; `note` puts the choice in the case's result."""

    name = "auto"

    def __init__(self, rule: DispatchRule, selectors: dict[str, Selector]) -> None:
        self.rule = rule
        self.selectors = selectors
        self.choices: dict[str, tuple[str, str]] = {}
        self._chosen: Selector | None = None

    def supports(self, case: Case, device: torch.device) -> str | None:
        seen = features(case) if self.rule.features else None
        kind, known = kind_for(case.attrs, case.row_starts, case.row_ends, case.cols, case.top_k)
        name, why = self.rule.choose(case.dtype, kind, case.rows, case.cols, seen)
        if known != f"labelled {kind}":  # inferred from the bounds, or a label the bounds contradict
            why = f"{why}; {known}"
        self.choices[case.case_id] = (name, why)
        self._chosen = self.selectors[name]
        reason = self._chosen.supports(case, device)
        return None if reason is None else f"chose {name} ({why}), which does not support it: {reason}"

    def note(self, case: Case) -> str:
        name, why = self.choices[case.case_id]
        return f"chose {name} ({why})"

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        if self._chosen is None:
            raise SelectorError("auto: prepare before supports (no case chosen)")
        return self._chosen.prepare(logits, row_starts, row_ends, top_k, out)


def parse_note(reason: str | None) -> tuple[str, str] | None:
    """(selector, why) from a result's reason when it is auto's note (`chose NAME (WHY)`), else None."""
    if not reason or not reason.startswith("chose ") or not reason.endswith(")") or " (" not in reason:
        return None
    name, why = reason.removeprefix("chose ").split(" (", 1)
    return name, why[:-1]


def from_environment() -> AutoSelector:
    """The registry's factory: the rule at `$LOGITREPLAY_DISPATCH_RULE`, with its selectors built by name."""
    from logitreplay.selectors.registry import build

    path = os.environ.get(RULE_ENV)
    if not path:
        raise SelectorError("auto needs a dispatch rule: --rule RULE.json (from replay --recommend --rule-out)")
    rule = DispatchRule.load(path)
    return AutoSelector(rule, {name: build(name) for name in rule.selectors})


__all__ = ["READS", "RULE_ENV", "SCHEMA", "AutoSelector", "Boundary", "Crossover", "DispatchRule", "Interval", "Override",
           "Overturn", "Scope", "axis", "from_environment", "parse_note", "position"]
