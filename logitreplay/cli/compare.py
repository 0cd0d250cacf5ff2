"""`logitreplay compare BASE.json NEW.json`: per case and selector, new / base with a 95% interval."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from logitreplay.cli.common import STDOUT, emit_json, json_option, plural, user_errors
from logitreplay.cli.report import read_report
from logitreplay.errors import DecisionError
from logitreplay.replay.compare import (
    MIN_SAMPLES,
    RESAMPLES,
    TOLERANCE,
    TOO_FEW,
    Comparison,
    comparable,
    compare,
)
from logitreplay.replay.report import Column, number, print_lines, render, short_names, unit, wrap
from logitreplay.replay.results import ReplayResult


@click.command("compare")
@click.argument("base_path", metavar="BASE.json", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.argument("new_path", metavar="NEW.json", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--fail-above", type=click.FloatRange(min=0, min_open=True), default=None, metavar="RATIO",
              help="Exit 1 when any ratio's whole 95% interval lies above RATIO (e.g. 1.03, for CI); refused "
              f"when a ratio has fewer than {MIN_SAMPLES} samples on a side.")
@click.option("--tolerance", type=click.FloatRange(min=0), default=TOLERANCE, show_default=True,
              help="A ratio is flagged slower (faster) only when its interval lies above 1 + T (below 1 / (1 + T)).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap resampling.")
@click.option("--resamples", type=click.IntRange(min=100), default=RESAMPLES, show_default=True)
@click.option("--force", is_flag=True, help="Compare reports from different GPUs or timing protocols anyway.")
@json_option("Every ratio with its interval and flag")
@user_errors
def compare_cmd(base_path: Path, new_path: Path, fail_above: float | None, tolerance: float, seed: int,
                resamples: int, force: bool, json_out: str | None) -> None:
    """Compare two `replay --json` reports: per case and selector the ratio NEW / BASE of median times,
    with a bootstrap 95% confidence interval from the stored samples and the samples behind it, flagged
    faster, slower or no change; a ratio with fewer than {MIN_SAMPLES} samples on a side is flagged
    "too few samples" instead. Two reports with no case and selector timed in both exit 1."""
    base, new = read_report(base_path), read_report(new_path)
    why = comparable(base, new)
    if why is not None and not force:
        raise DecisionError(f"not comparable: {why} (--force compares anyway)")
    result = compare(base, new, tolerance, seed, resamples)
    if why is not None:
        result.notes.insert(0, f"compared with --force although {why}")
    if not result.rows and not result.recall:
        raise DecisionError(f"nothing to compare: no case and selector was timed in both reports ({base_path}: "
                            f"{plural(len(base.cases), 'case')}, {new_path}: {plural(len(new.cases), 'case')})")
    few = result.too_few()
    if fail_above is not None and few:
        raise DecisionError(f"--fail-above needs at least {MIN_SAMPLES} samples on each side of a ratio; "
                            f"{plural(len(few), 'ratio')} of {len(result.rows)} have fewer (e.g. {few[0].case_id}/"
                            f"{few[0].selector}: {few[0].base_samples} and {few[0].new_samples}): replay with more "
                            "--rounds")
    above = [] if fail_above is None else result.above(fail_above)
    if json_out is not None:
        emit_json({"base": str(base_path), "new": str(new_path), "fail_above": fail_above, "failed": bool(above),
                   **result.to_json()}, json_out, indent=1)
    if json_out != STDOUT:
        _print(result, base, base_path, new_path)
    if above:
        worst = max(above, key=lambda r: r.low)
        raise click.ClickException(f"--fail-above {fail_above:g}: {len(above)} ratios lie above it, worst "
                                   f"{worst.case_id}/{worst.selector} {worst.ratio:.3f}x "
                                   f"[{worst.low:.3f}, {worst.high:.3f}]")


def _recall_lines(result: Comparison, short: dict[str, str]) -> list[str]:
    """The selections whose values were not exact in a report: each side's status and least recall."""
    if not result.recall:
        return []

    def side(status: str | None, recall: float | None) -> str:
        return "-" if status is None else status if recall is None else f"{status} {recall:.4f}"

    columns = [Column("case / sel"), Column("base: least recall", right=True), Column("new: least recall", right=True)]
    rows = [(r.case_id, [short.get(r.selector, r.selector), side(r.base_status, r.base_recall),
                         side(r.new_status, r.new_recall)]) for r in result.recall]
    return wrap("values not exact in a report (recall: the least fraction of a row's exact top-k values "
                "found; 1.0000: exact):") + _by_case(columns, rows)


def _by_case(columns: list[Column], rows: list[tuple[str, list[str]]]) -> list[str]:
    """A table whose rows stand under their case's whole id, on a line of its own: an id is never folded,
    so it can be copied into --case; the first column's cells are indented under it."""
    body = render(columns, [["  " + cells[0], *cells[1:]] for _, cells in rows])
    out, last = body[:2], None
    for (case_id, _), text in zip(rows, body[2:], strict=True):
        if case_id != last:
            out.append(case_id)
            last = case_id
        out.append(text)
    return out


def _print(result: Comparison, base: ReplayResult, base_path: Path, new_path: Path) -> None:
    """The ratios as one table within WIDTH columns (each case's whole id on a line of its own above its
    selectors), in the unit of the reports' device kind, then the counts, what only one report timed, and
    the notes."""
    name_of_unit, scale = unit(base.device)
    short = short_names(base.selectors)
    columns = [Column("case / sel"), Column(f"base {name_of_unit}", right=True),
               Column(f"new {name_of_unit}", right=True), Column("n", right=True), Column("ratio", right=True),
               Column("95% interval", right=True), Column("flag")]
    rows = [(r.case_id, [short.get(r.selector, r.selector), number(r.base_us / scale), number(r.new_us / scale),
                         f"{r.base_samples}/{r.new_samples}", f"{r.ratio:.3f}", f"{r.low:.3f}-{r.high:.3f}",
                         "too few" if r.flag == TOO_FEW else r.flag])
            for r in result.rows]
    lines = wrap(f"{new_path} / {base_path}: ratio of medians, bootstrap 95% interval; n: samples in "
                 "BASE/NEW") + _by_case(columns, rows)
    changed = [f"{s} = {name}" for name, s in short.items() if s != name]
    if changed:
        lines += wrap("sel: " + ", ".join(changed))
    counts = {f: sum(r.flag == f for r in result.rows) for f in ("faster", "slower", "no change", TOO_FEW)}
    lines += wrap(", ".join(f"{n} {f}" for f, n in counts.items() if n or f != TOO_FEW)
                  + f" (tolerance {result.tolerance:g})")
    if counts[TOO_FEW]:
        lines += wrap(f"too few: under {MIN_SAMPLES} samples on a side, a 95% interval of a median is not to be "
                      "had from the samples, so no flag (replay with more --rounds)")
    lines += _recall_lines(result, short)
    for what, items in (("only in BASE", result.only_base), ("only in NEW", result.only_new)):
        if items:
            lines += wrap(f"{what}: {', '.join(items[:5])}" + (" ..." if len(items) > 5 else ""))
    for note in result.notes:
        lines += wrap(f"note: {note}")
    print_lines(Console(), lines)
