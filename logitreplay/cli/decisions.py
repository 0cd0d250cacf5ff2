"""What `replay` prints for its decision options: `--controls` (each real case beside its controls),
`--per-forward` (top-k time per forward pass), `--selectors auto` (the choice per case, and auto against
the per-case best) and `--rule-out` (the fitted dispatch rule). The numbers come from the replay stage;
this module only lays them out."""

from __future__ import annotations

from collections.abc import Sequence

import click
from rich.console import Console

from logitreplay.datasets import controls as derived
from logitreplay.replay.compare import auto_vs_best
from logitreplay.replay.controls import control_rows
from logitreplay.replay.per_forward import ArchiveForwards
from logitreplay.replay.recommend import PairRule, auto_summary, rule_device_mismatch
from logitreplay.replay.report import Column, number, print_lines, render, short_ids, short_names, unit, wrap
from logitreplay.replay.results import ReplayResult
from logitreplay.selectors.auto import DispatchRule, parse_note


def controls_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    """click callback: `matched,ablate,shuffle` -> the kinds, or a one-line usage error."""
    if not value:
        return ()
    try:
        return derived.parse(value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx, param) from None


def _time(x: float | None, scale: float = 1.0) -> str:
    return "-" if x is None else number(x / scale)


def _x(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def print_recommend(rules: Sequence[PairRule], console: Console) -> None:
    """`--recommend`: a line per selector pair (wrapped within the table width)."""
    print_lines(console, ["dispatch rule (measured; the bounding cases are in the JSON):" if rules else
                          "dispatch rule: no two selectors were timed on a common width"])
    print_lines(console, [w for r in rules for w in wrap(f"  {r.rule}")])


def print_controls(result: ReplayResult, console: Console) -> None:
    rows = control_rows(result)
    if not rows:
        return
    name_of_unit, scale = unit(result.device)
    names = [n for n in ("matched", "ablate+100", "ablate*1e-8", "shuffle", "indexer")
             if any(n in r.control_us for r in rows)]
    short = short_names(result.selectors)
    columns = [Column("case", fold=True), Column("sel"), Column("real", right=True),
               *(Column(n.removeprefix("ablate"), right=True) for n in names), Column("real/matched", right=True)]
    cells = [[r.case_id, short[r.selector], _time(r.real_us, scale),
              *(_time(r.control_us.get(n), scale) for n in names), _x(r.real_over_matched)] for r in rows]
    print_lines(console, wrap(f"real cases and their controls: median {name_of_unit} (real/matched < 1: random "
                              "data overstates the selector's time on these logits)") + render(columns, cells))


def annotate_auto(result: ReplayResult, rule: DispatchRule, console: Console) -> None:
    """Record auto's choice in each of its results (`reason`), print them, and score auto against the
    fastest of the rule's selectors where they were replayed too."""
    cases = [c for c in result.cases if c.result("auto") is not None and not c.invalid]
    ids = short_ids([(c.case_id, c.cols, c.rows, c.top_k) for c in cases])
    cells = []
    for case, case_id in zip(cases, ids, strict=True):
        res = case.result("auto")
        name, why = parse_note(res.reason if res is not None else None) or rule.choose(case.dtype, case.kind,
                                                                                   case.rows, case.cols)
        if res is not None and res.status == "ok":
            res.reason = f"chose {name} ({why})"
        cells.append([case_id, str(case.cols), str(case.rows), str(case.top_k), _DTYPE.get(case.dtype, case.dtype),
                      case.kind, name, why])
    columns = [Column("case", fold=True), *(Column(h, right=True) for h in ("cols", "rows", "k")), Column("dtype"),
               Column("kind"), Column("chose"), Column("why", fold=True)]
    print_lines(console, ["auto: the selector the rule chose per case (case ids without cols/rows/k)",
                          *render(columns, cells)])
    among = [s for s in rule.selectors if s in result.selectors]
    score = auto_vs_best(result, among)
    if score.cases:
        print_lines(console, wrap(f"auto vs the per-case fastest of {', '.join(among)}: {auto_summary(score)}"))
    mismatch = rule_device_mismatch(rule, result.device)
    if mismatch:
        result.notes.append(mismatch)
        print_lines(console, wrap(f"warning: {mismatch}"))


_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}


def print_per_forward(totals: Sequence[ArchiveForwards], suite: str | None, console: Console,
                      device: str) -> None:
    """Per archive, each selector's top-k time per forward (in the replay device's unit) and its share of
    the captured forward (whose time is the capture's, in us)."""
    name_of_unit, scale = unit(device)
    for a in totals:
        if a.no_records:
            print_lines(console, wrap(f"per forward, {a.location}: {a.no_records}"))
            continue
        wall = ("no forward time recorded" if a.forward_us is None else
                f"forward {number(a.forward_us / scale)} {name_of_unit} ({a.timer})")
        columns = [Column("selector"), Column(f"top-k {name_of_unit}/forward", right=True), Column("share", right=True),
                   Column("calls untimed", right=True)]
        cells = [[s.selector, _time(s.topk_us_per_forward, scale),
                  "-" if s.share_of_forward is None else f"{s.share_of_forward:.1%}", str(s.untimed_calls)]
                 for s in a.totals]
        print_lines(console, wrap(f"per forward, {a.location}: {a.forwards} forwards, {a.calls / a.forwards:.1f} "
                                  f"top-k calls each, {wall}") + render(columns, cells)
                    + wrap(f"{a.covered_calls} of {a.calls} calls stood for by a replayed case of their layer "
                           f"({a.exact_width_calls} at exactly their width, the rest at the nearest); share: of "
                           "the forward; calls untimed: calls without a time"))
        if a.share_note:
            print_lines(console, wrap(f"share: {a.share_note}"))
        if any(s.share_of_forward is not None and s.share_of_forward > 1 for s in a.totals):
            print_lines(console, wrap("share above 100%: the selector's calls take longer than the whole recorded "
                                      "forward took" + (" (the CPU models of the bundled kernels are far slower "
                                                        "than the top-k the forward ran)" if device.startswith("cpu") else "")))
        if a.uncovered:
            print_lines(console, wrap("  uncovered calls (no replayed case of their layer): " + "; ".join(
                f"layer {u['layer']} width {u['width']} rows {u['rows']} {u['kind']} x{u['calls']}"
                for u in a.uncovered[:10]) + (" ..." if len(a.uncovered) > 10 else "")))
    if suite:
        print_lines(console, [f"per forward, suite {suite}: synthetic cases have no call records"])


def print_rule(rule: DispatchRule, console: Console) -> None:
    print_lines(console, [w for line in rule.describe() for w in wrap(f"  {line}")])
