"""Reports of a replay: a terminal table in the layout of the published captured-logits tables
(logits columns | query rows | source | one column per selector | baseline/other ratios), the JSON
(`results.py`, validated by `report.schema.json`), a CSV of one line per case and selector, and
a PNG plot.

A cell is the median time in microseconds when the selector was verified and timed, otherwise what
happened: `unsupported: <reason>`, `FAILED: check N (name) row R`, `ERROR: <exception>`.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult

_CELL_CHARS = 48


def cell(res: SelectorResult | None) -> str:
    if res is None:
        return ""
    if res.status == "ok" and res.timing is not None:
        return f"{res.timing.median_us:.1f}"
    if res.status == "unsupported":
        return f"unsupported: {res.reason}"
    if res.status == "failed":
        return f"FAILED: {res.reason} row {res.failures[0].row}"
    reason = res.reason or ""  # printed in full under the table
    return f"ERROR: {reason if len(reason) <= _CELL_CHARS else reason[:_CELL_CHARS - 3] + '...'}"


def ratio(case: CaseResult, baseline: str, other: str) -> float | None:
    """baseline median / other median: above 1 means `other` is faster than the baseline."""
    b, o = case.timed(baseline), case.timed(other)
    if b is None or o is None or o.median_us <= 0:
        return None
    return b.median_us / o.median_us


def _source(case: CaseResult) -> str:
    return case.source if case.dtype == "float32" else f"{case.source}, {case.dtype}"


def table(result: ReplayResult) -> Table:
    t = Table(title=f"{result.clock_label}: median us per call", title_justify="left",
              caption=result.protocol.describe(),
              caption_justify="left")
    t.add_column("logits cols", justify="right")
    t.add_column("query rows", justify="right")
    t.add_column("k", justify="right")
    t.add_column("source")
    t.add_column("DS fast path")  # would vLLM route this case to DeepSelect's prefill fast path
    floors = any(c.floor_us is not None for c in result.cases)
    if floors:
        t.add_column("read floor us", justify="right")
    for name in result.selectors:
        t.add_column(name, justify="right", overflow="fold")
    # A ratio column for every other selector that was timed somewhere.
    others = [s for s in result.selectors if result.baseline and s != result.baseline
              and any(c.timed(s) is not None for c in result.cases)]
    for name in others:
        t.add_column(f"{result.baseline}/{name}", justify="right")
    for case in result.cases:
        row = [str(case.cols), str(case.rows), str(case.top_k), _source(case),
               "yes" if case.fast_path else f"no: {case.fast_path_note}"]
        if floors:
            row.append("" if case.floor_us is None else f"{case.floor_us:.1f}")
        if case.invalid:
            row += [f"invalid: {case.invalid}"] * len(result.selectors) + [""] * len(others)
        else:
            row += [cell(case.result(s)) for s in result.selectors]
            for name in others:
                r = ratio(case, result.baseline or "", name)
                row.append("" if r is None else f"{r:.2f}x")
        t.add_row(*row)
    return t


def print_report(result: ReplayResult, console: Console) -> None:
    """The table, then every failure in full (check, case, row, example), every error, and the notes."""
    console.print(table(result))
    for case in result.cases:
        for res in case.results:
            for f in res.failures:
                console.print(f"[red]FAILED[/red] {res.selector}: {f}", highlight=False)
            if res.status == "error":
                console.print(f"[red]ERROR[/red] {res.selector} on case {case.case_id}: {res.reason}",
                              highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)


CSV_FIELDS = ("case_id", "cols", "rows", "top_k", "dtype", "source", "selector", "status", "median_us",
              "p10_us", "p90_us", "cv", "samples", "ratio_to_baseline", "floor_us", "reason")


def write_csv(result: ReplayResult, path: Path) -> None:
    """One line per (case, selector); an invalid case gets one line per selector with its reason."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for case in result.cases:
            base = {"case_id": case.case_id, "cols": case.cols, "rows": case.rows, "top_k": case.top_k,
                    "dtype": case.dtype, "source": case.source,
                    "floor_us": "" if case.floor_us is None else f"{case.floor_us:.3f}"}
            for name in result.selectors:
                res = case.result(name)
                line: dict[str, Any] = {**base, "selector": name}
                if case.invalid or res is None:
                    line.update(status="invalid", reason=case.invalid or "")
                else:
                    line.update(status=res.status, reason=res.reason or "")
                    if res.timing is not None:
                        t = res.timing
                        r = ratio(case, result.baseline or "", name) if result.baseline else None
                        line.update(median_us=f"{t.median_us:.3f}", p10_us=f"{t.quantile(0.1):.3f}",
                                    p90_us=f"{t.quantile(0.9):.3f}", cv=f"{t.cv:.4f}",
                                    samples=len(t.samples_us), ratio_to_baseline="" if r is None else f"{r:.4f}")
                w.writerow(line)


def write_plot(result: ReplayResult, path: Path) -> None:
    """Grouped bars of median time per case and selector (log scale), p10-p90 as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [c for c in result.cases if not c.invalid]
    width = 0.8 / max(1, len(result.selectors))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(cases) + 2), 4.5))
    for i, name in enumerate(result.selectors):
        xs, ys, lo, hi = [], [], [], []
        for j, case in enumerate(cases):
            timing = case.timed(name)
            if timing is not None:
                m = timing.median_us
                xs.append(j + (i - (len(result.selectors) - 1) / 2) * width)
                ys.append(m)
                lo.append(m - timing.quantile(0.1))
                hi.append(timing.quantile(0.9) - m)
        ax.bar(xs, ys, width, yerr=[lo, hi], label=name, capsize=2)
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{c.cols}x{c.rows}\nk={c.top_k}\n{_source(c)}" for c in cases], fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("median time per call (us)")
    ax.set_title(result.clock_label, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
