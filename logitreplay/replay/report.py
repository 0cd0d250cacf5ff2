"""Reports of a replay: a terminal table, the JSON (`results.py`, validated by `report.schema.json`), a
CSV of one line per case and selector, and a PNG plot.

The table comes in two layouts. The default one fits an 80-column terminal: a short case id (the id
without the parts the cols/rows/k columns already show), abbreviated selector names and ratio headers
with a legend, and one-word cells whose reasons are printed in full under the table. `wide` is the
layout of the published captured-logits tables (logits columns | query rows | source | DS fast path |
one column per selector | baseline/other ratios) with every reason in its cell.

A timed cell is the median time in microseconds (milliseconds for tables of CPU models), marked `~` when the samples' coefficient of variation
exceeds `DISPERSION_CV` (their spread is then larger than the differences a reader may look for). A cell
that was not timed says what happened: unsupported (and why), FAILED (the check), ERROR (the exception).
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table

from logitreplay.replay.protocol import Timing
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult

_CELL_CHARS = 48
DISPERSION_CV = 0.05  # above it a timed cell is marked `~`
NOISY = "~"
# Short forms of the built-in names for the narrow table; other names longer than 7 characters keep 6.
_SHORT = {"reference": "ref", "native": "nat", "deepselect": "dsel"}


def unit(result: ReplayResult) -> tuple[str, float]:
    """The table's time unit and its size in microseconds: ms once a median reaches 0.1 s (the CPU models),
    so that no cell needs more than 6 digits."""
    medians = [r.timing.median_us for c in result.cases for r in c.results if r.timing is not None]
    return ("ms", 1000.0) if medians and max(medians) >= 1e5 else ("us", 1.0)


def _time(t: Timing, scale: float = 1.0) -> str:
    value = t.median_us / scale
    text = f"{value:.1f}" if value < 1000 else f"{value:.0f}"
    return text + (NOISY if t.cv > DISPERSION_CV else "")


def cell(res: SelectorResult | None, scale: float = 1.0) -> str:
    """A cell of the wide table: the median (in units of `scale` us), or what happened, in words."""
    if res is None:
        return ""
    if res.status == "ok" and res.timing is not None:
        return _time(res.timing, scale)
    if res.status == "unsupported":
        return f"unsupported: {res.reason}"
    if res.status == "failed":
        return f"FAILED: {res.reason} row {res.failures[0].row}"
    reason = res.reason or ""  # printed in full under the table
    return f"ERROR: {reason if len(reason) <= _CELL_CHARS else reason[:_CELL_CHARS - 3] + '...'}"


def short_cell(res: SelectorResult | None, scale: float = 1.0) -> str:
    """A cell of the narrow table: the median, or one word (the reasons follow the table)."""
    if res is None:
        return ""
    if res.status == "ok" and res.timing is not None:
        return _time(res.timing, scale)
    if res.status == "failed":
        return f"FAIL c{res.failures[0].check}" if res.failures else "FAIL"
    return {"unsupported": "unsup", "error": "ERROR"}.get(res.status, res.status)


def ratio(case: CaseResult, baseline: str, other: str) -> float | None:
    """baseline median / other median: above 1 means `other` is faster than the baseline."""
    b, o = case.timed(baseline), case.timed(other)
    if b is None or o is None or o.median_us <= 0:
        return None
    return b.median_us / o.median_us


def _source(case: CaseResult) -> str:
    return case.source if case.dtype == "float32" else f"{case.source}, {case.dtype}"


def short_names(names: list[str]) -> dict[str, str]:
    """A short, unique header for every selector name (the legend spells out the ones that changed)."""
    out: dict[str, str] = {}
    for name in names:
        short = _SHORT.get(name, name if len(name) <= 7 else name[:6])
        candidate, n = short, 2
        while candidate in out.values():
            candidate, n = f"{short[:5]}{n}", n + 1
        out[name] = candidate
    return out


def short_case_id(case: CaseResult) -> str:
    """The case id without the `c<cols>`, `w<cols>`, `r<rows>` and `k<top_k>` parts the table shows
    beside it (`a-normal-c1024-r512-k512` -> `a-normal`); the whole id when nothing would be left."""
    shown = {f"c{case.cols}", f"w{case.cols}", f"r{case.rows}", f"k{case.top_k}"}
    kept = [part for part in case.case_id.split("-") if part not in shown]
    short = "-".join(kept)
    return short if kept and short else case.case_id


def _short_ids(cases: list[CaseResult]) -> list[str]:
    """Short ids, or the whole ids where two rows would read the same (short id, cols, rows, k)."""
    keys = [(short_case_id(c), c.cols, c.rows, c.top_k) for c in cases]
    counts = Counter(keys)
    return [k[0] if counts[k] == 1 else c.case_id for k, c in zip(keys, cases, strict=True)]


def _ratio_columns(result: ReplayResult) -> list[str]:
    """A ratio column for every other selector that was timed somewhere."""
    return [s for s in result.selectors if result.baseline and s != result.baseline
            and any(c.timed(s) is not None for c in result.cases)]


def table(result: ReplayResult, wide: bool = False) -> Table:
    """The report's table (see the module docstring for the two layouts)."""
    scale = unit(result)[1]
    if wide:
        t = Table()
    else:  # no vertical rules: two spaces between columns leave the numbers their room
        t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    names = {s: s for s in result.selectors} if wide else short_names(result.selectors)
    others = _ratio_columns(result)
    floors = any(c.floor_us is not None for c in result.cases)
    t.add_column("case", overflow="fold")
    for header in (("logits cols", "query rows", "k") if wide else ("cols", "rows", "k")):
        t.add_column(header, justify="right", no_wrap=True)
    if wide:
        t.add_column("source")
        t.add_column("DS fast path")  # would vLLM route this case to DeepSelect's prefill fast path
    if floors:
        t.add_column("read floor us" if wide else "floor", justify="right", no_wrap=True)
    for name in result.selectors:
        t.add_column(names[name], justify="right", no_wrap=not wide, overflow="fold")
    base = names.get(result.baseline or "", "")
    for name in others:
        t.add_column(f"{base}/{names[name]}" if wide else f"/{names[name]}", justify="right", no_wrap=True)
    ids = [c.case_id for c in result.cases] if wide else _short_ids(result.cases)
    for case, case_id in zip(result.cases, ids, strict=True):
        row = [case_id, str(case.cols), str(case.rows), str(case.top_k)]
        if wide:
            row += [_source(case), "yes" if case.fast_path else f"no: {case.fast_path_note}"]
        if floors:
            row.append("" if case.floor_us is None else f"{case.floor_us:.1f}")
        if case.invalid:
            row += [f"invalid: {case.invalid}" if wide else "invalid"] * len(result.selectors) + [""] * len(others)
        else:
            row += [(cell if wide else short_cell)(case.result(s), scale) for s in result.selectors]
            for name in others:
                r = ratio(case, result.baseline or "", name)
                row.append("" if r is None else f"{r:.2f}x")
        t.add_row(*row)
    return t


def legend(result: ReplayResult, wide: bool = False) -> list[str]:
    """What the narrow table's abbreviations, marks and one-word cells mean, and why the cases it does not
    explain in its cells were not timed; the wide table needs only the marks."""
    lines = []
    cells = [r for c in result.cases for r in c.results]
    noisy = any(r.timing is not None and r.timing.cv > DISPERSION_CV for r in cells)
    if not wide:
        names = short_names(result.selectors)
        changed = [f"{short} = {name}" for name, short in names.items() if short != name]
        lines.append("case: id minus its cols/rows/k parts (--wide: whole ids; --case GLOB filters)")
        if changed:
            lines.append("selectors: " + ", ".join(changed))
        if _ratio_columns(result):
            base = names[result.baseline or ""]
            lines.append(f"/X: {base} time / X time (above 1: X is faster than {base})")
        lines += _not_timed(result)
        lines += _fast_path(result)
    if noisy:
        lines.append(f"{NOISY}: the samples' CV is above {DISPERSION_CV:.0%}: compare with care, or use more --rounds")
    return lines


def _not_timed(result: ReplayResult) -> list[str]:
    """One line per (selector, reason) an unsupported cell stands for; invalid cases with their reason."""
    unsupported = Counter((r.selector, r.reason) for c in result.cases for r in c.results if r.status == "unsupported")
    lines = [f"unsup: {sel} declined {n} case{'s' if n != 1 else ''}: {why}" for (sel, why), n in unsupported.items()]
    lines += [f"invalid: case {c.case_id}: {c.invalid}" for c in result.cases if c.invalid]
    if any(r.status == "failed" for c in result.cases for r in c.results):
        lines.append("FAIL cN: verification check N failed (details below)")
    return lines


def _fast_path(result: ReplayResult) -> list[str]:
    """Which cases vLLM would not send to DeepSelect's prefill fast path, grouped by reason."""
    why_not = Counter(c.fast_path_note for c in result.cases if not c.invalid and not c.fast_path)
    if not why_not:
        return []
    parts = [f"{n} case{'s' if n != 1 else ''}: {note}" for note, n in why_not.items()]
    return ["DS fast path (vLLM): not for " + "; ".join(parts)]


def problems(result: ReplayResult) -> list[str]:
    """`case/selector` for every result that failed verification or raised, and every invalid case."""
    bad = [f"{c.case_id}/{r.selector}" for c in result.cases for r in c.results if r.status in ("failed", "error")]
    return bad + [f"{c.case_id} ({'incomplete' if c.invalid.startswith('incomplete') else 'invalid'})"
                  for c in result.cases if c.invalid]


def heading(result: ReplayResult) -> list[str]:
    """The lines above the table: what the times are, on which device, in which unit; the protocol."""
    return [f"{result.device}: {result.clock_label}; median {unit(result)[0]} per call", result.protocol.describe()]


def print_report(result: ReplayResult, console: Console, wide: bool = False) -> None:
    """The heading, the table and its legend, then every failure in full (check, case, row, example),
    every error, and the notes. (A table's title and caption would wrap at the table's own width.)"""
    for line in heading(result):
        console.print(line, highlight=False, markup=False)
    console.print(table(result, wide))
    for line in legend(result, wide):
        console.print(line, highlight=False, markup=False)
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


# Marks of the cells that have no bar, drawn at the foot of the axes in the selector's colour.
_MARKS = {"unsupported": ("x", "unsupported"), "failed": ("X", "failed or error"), "error": ("X", "failed or error")}


def plot_figure(result: ReplayResult) -> Any:
    """Grouped bars of median time per case and selector (log scale), p10-p90 as error bars. Every
    selector keeps its own colour in the legend even where it has no bar; a cell that was not timed gets
    a mark at the foot of its bar's place (x: unsupported, X: failed or error)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    cases = [c for c in result.cases if not c.invalid]
    n = max(1, len(result.selectors))
    width = 0.8 / n
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(cases) + 2), 4.8))
    handles: list[Any] = []
    shown_marks: dict[str, str] = {}
    for i, name in enumerate(result.selectors):
        colour = colours[i % len(colours)]
        xs, ys, lo, hi = [], [], [], []
        for j, case in enumerate(cases):
            x = j + (i - (n - 1) / 2) * width
            timing, res = case.timed(name), case.result(name)
            if timing is not None:
                m = timing.median_us
                xs.append(x)
                ys.append(m)
                lo.append(m - timing.quantile(0.1))
                hi.append(timing.quantile(0.9) - m)
            elif res is not None and res.status in _MARKS:
                marker, what = _MARKS[res.status]
                ax.plot([x], [0.03], marker=marker, color=colour, markersize=8, linestyle="none",
                        transform=ax.get_xaxis_transform(), clip_on=False)
                shown_marks[marker] = what
        if xs:
            ax.bar(xs, ys, width, yerr=[lo, hi], color=colour, capsize=2)
        handles.append(Patch(color=colour, label=name if xs else f"{name} (not timed)"))
    handles += [Line2D([], [], marker=m, color="0.3", linestyle="none", label=what) for m, what in shown_marks.items()]
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels([f"{cid}\n{c.cols}x{c.rows}, k={c.top_k}" for cid, c in zip(_short_ids(cases), cases,
                                                                                     strict=True)],
                       fontsize=7, ha="center", multialignment="center")
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.set_yscale("log")
    ax.set_xlabel("case (logits cols x query rows, k)")
    ax.set_ylabel("median time per call (us)")
    ax.set_title(f"{result.device}: {result.clock_label}", fontsize=9)
    ax.legend(handles=handles, fontsize=8)
    fig.tight_layout()
    return fig


def write_plot(result: ReplayResult, path: Path) -> None:
    """`plot_figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = plot_figure(result)
    fig.savefig(path, dpi=120)
    plt.close(fig)
