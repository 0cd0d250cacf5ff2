"""What `replay` prints for its decision options: `--controls` (each real case beside its controls),
`--per-forward` (top-k time per forward pass), `--selectors auto` (the choice per case, and auto against
the per-case best) and `--rule-out` (the fitted dispatch rule). The numbers come from the replay stage;
this module only lays them out."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.console import Console
from rich.table import Table

from logitreplay.datasets import controls as derived
from logitreplay.replay.compare import auto_vs_best
from logitreplay.replay.controls import control_rows
from logitreplay.replay.per_forward import ArchiveForwards
from logitreplay.replay.results import ReplayResult
from logitreplay.selectors.auto import DispatchRule, axis


def controls_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    """click callback: `matched,ablate,shuffle` -> the kinds, or a one-line usage error."""
    if not value:
        return ()
    try:
        return derived.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def print_controls(result: ReplayResult, console: Console) -> None:
    rows = control_rows(result)
    if not rows:
        return
    names = [n for n in ("matched", "ablate+100", "ablate*1e-8", "shuffle")
             if any(n in r.control_us for r in rows)]
    t = Table(title="real cases and their controls: median us (real/matched < 1: random data overstates the "
              "selector's time on these logits)", title_justify="left")
    t.add_column("case", overflow="fold")
    t.add_column("selector")
    t.add_column("real", justify="right")
    for n in names:
        t.add_column(n.removeprefix("ablate"), justify="right")
    t.add_column("real/matched", justify="right")
    for r in rows:
        t.add_row(r.case_id, r.selector, _us(r.real_us), *(_us(r.control_us.get(n)) for n in names),
                  _x(r.real_over_matched))
    console.print(t)


def annotate_auto(result: ReplayResult, rule: DispatchRule, console: Console) -> None:
    """Record auto's choice in each of its results (`reason`), print them, and score auto against the
    fastest of the rule's selectors where they were replayed too."""
    t = Table(title="auto: the selector the rule chose per case", title_justify="left")
    for col in ("case", "rows", "cols", "dtype", "kind", "chose", "why"):
        t.add_column(col, overflow="fold")
    for case in result.cases:
        res = case.result("auto")
        if res is None or case.invalid:
            continue
        name, why = rule.choose(case.dtype, case.kind, case.rows, case.cols)
        if res.status == "ok":
            res.reason = f"chose {name} ({why})"
        t.add_row(case.case_id, str(case.rows), str(case.cols), case.dtype, case.kind, name, why)
    console.print(t)
    among = [s for s in rule.selectors if s in result.selectors]
    score = auto_vs_best(result, among)
    if score.cases:
        console.print(f"auto vs the per-case fastest of {', '.join(among)}: within 3% on {score.within} of "
                      f"{score.cases} cases ({score.within / score.cases:.0%}); worst {score.worst_ratio:.2f}x "
                      f"({score.worst_case})", markup=False)


def print_per_forward(totals: Sequence[ArchiveForwards], suite: str | None, console: Console) -> None:
    for a in totals:
        if a.no_records:
            console.print(f"per forward, {a.location}: {a.no_records}", markup=False)
            continue
        wall = "no forward time recorded" if a.forward_us is None else f"forward {a.forward_us:.1f} us ({a.timer})"
        t = Table(title=f"per forward, {a.location}: {a.forwards} forwards, {a.calls / a.forwards:.1f} top-k calls "
                  f"each, {wall}", title_justify="left",
                  caption=f"{a.covered_calls} of {a.calls} calls stood for by a replayed case of their layer "
                  f"({a.exact_width_calls} at exactly their width, the rest at the nearest)", caption_justify="left")
        for col in ("selector", "top-k us / forward", "share of forward", "calls without a time"):
            t.add_column(col, justify="right" if col != "selector" else "left")
        for s in a.totals:
            t.add_row(s.selector, _us(s.topk_us_per_forward),
                      "-" if s.share_of_forward is None else f"{s.share_of_forward:.1%}", str(s.untimed_calls))
        console.print(t)
        if a.uncovered:
            console.print("  uncovered calls (no replayed case of their layer): " + "; ".join(
                f"layer {u['layer']} width {u['width']} rows {u['rows']} {u['kind']} x{u['calls']}"
                for u in a.uncovered[:10]) + (" ..." if len(a.uncovered) > 10 else ""), markup=False)
    if suite:
        console.print(f"per forward, suite {suite}: synthetic cases have no call records", markup=False)


def print_rule(rule: DispatchRule, console: Console) -> None:
    for scope in rule.scopes:
        parts = [f"{iv.selector} for {iv.lo} <= {axis(scope.kind)}" + ("" if iv.hi is None else f" < {iv.hi}")
                 for iv in scope.intervals]
        console.print(f"  rule {scope.dtype} {scope.kind}: " + "; ".join(parts), markup=False)
        for b in scope.boundaries:
            console.print(f"    boundary {b.width:.0f}: {b.below} {b.margin_below:.2f}x faster at {b.lower_width}, "
                          f"{b.above} {b.margin_above:.2f}x faster at {b.upper_width}", markup=False)
        for o in scope.overturned:
            console.print(f"    overturned at {axis(scope.kind)} {o.position} by {o.source}: {o.faster} {o.margin:.2f}x faster than "
                          f"{o.rule_selector} ({len(o.cases)} cases)", markup=False)
