"""Reports of a replay: a terminal table, the JSON (`results.py`, validated by `report.schema.json`), a
CSV of one line per case and selector, and a PNG plot.

Every table of every command is laid out by `render` (plain lines, no trailing spaces), within `WIDTH`
columns unless --wide. The replay table comes in two layouts. The default one fits 80 columns: a short
case id (the id without the parts the cols/rows/k columns already show), abbreviated selector names and
ratio headers with a legend, and one-word cells whose reasons are printed in full under the table; where
more ratio columns than fit were measured, it leaves out the last ones and says so. `wide` is the layout
of the published captured-logits tables (logits columns | query rows | source | DS fast path | one
column per selector | baseline/other ratios) with every reason in its cell.

A timed cell is the median time in the unit of its device kind (`unit`: ms for the CPU models, us for
CUDA kernels; tables, comparisons and plots alike), marked `~` when the samples' coefficient of
variation exceeds `DISPERSION_CV` (their spread is then larger than the differences a reader may look
for). A cell that was not timed says what happened: unsupported (and why), FAILED (the check), ERROR
(the exception).
"""

from __future__ import annotations

import csv
import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from logitreplay.archive.ids import short_id
from logitreplay.replay.protocol import Timing
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult

_CELL_CHARS = 48
DISPERSION_CV = 0.05  # above it a timed cell is marked `~`
NOISY = "~"
APPROXIMATE = "\u2248"  # a timed cell of a selector that passed on recall (--tolerate-recall), not exact values
NONDETERMINISTIC = "!"  # a timed cell of a selector whose reruns (--determinism N) returned other index sets
# Short forms of the built-in names for the narrow table; other names longer than 7 characters keep 6.
_SHORT = {"reference": "ref", "native": "nat", "deepselect": "dsel", "native-det": "nat-d", "deepselect-det": "dsel-d",
          "split-det": "split-d"}


# -- the one table renderer of every command


WIDTH = 80  # every table and line for people fits this many columns, unless --wide asks for all
_GAP = "  "


@dataclass(frozen=True)
class Column:
    """A table column: its header, right-aligned (numbers) or not, and whether its cells may wrap over
    several lines when the table is too wide (ids, reasons; never numbers)."""

    header: str
    right: bool = False
    fold: bool = False
    least: int = 8  # a fold column narrows to no less (and never below its header)


def render(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int | None = WIDTH) -> list[str]:
    """Plain lines of a table: the headers, a rule, then the rows, two spaces between columns and no
    trailing spaces (piped output stays clean). Above `width`, the fold columns narrow, the widest first,
    down to their header or `least` characters, their cells folded after hyphens and spaces;
    `width=None` (--wide) keeps every cell on one line."""
    sizes = [max([len(c.header), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    floor = [min(s, max(len(c.header), c.least)) if c.fold else s for c, s in zip(columns, sizes, strict=True)]
    while width is not None and sum(sizes) + len(_GAP) * (len(sizes) - 1) > width:
        narrowable = [i for i in range(len(sizes)) if sizes[i] > floor[i]]
        if not narrowable:
            break  # the caller chose more columns than fit; tests keep every command's tables in WIDTH
        sizes[max(narrowable, key=lambda i: sizes[i])] -= 1

    def line(cells: Sequence[str]) -> str:
        return _GAP.join(c.rjust(n) if col.right else c.ljust(n)
                         for c, n, col in zip(cells, sizes, columns, strict=True)).rstrip()

    out = [line([c.header for c in columns]), "\u2500" * (sum(sizes) + len(_GAP) * (len(sizes) - 1))]
    for row in rows:
        parts = [fold(c, n) if col.fold and len(c) > n else [c] for c, n, col in zip(row, sizes, columns, strict=True)]
        for k in range(max(len(p) for p in parts)):
            out.append(line([p[k] if k < len(p) else "" for p in parts]))
    return out


def fold(text: str, width: int) -> list[str]:
    """`text` over lines of at most `width`, broken after hyphens and spaces (`a-normal-bf16-` /
    `requests`), a piece longer than a line cut where it must."""
    lines, line = [], ""
    for piece in re.findall(r"[^-\s]*[-\s]|[^-\s]+$", text):
        if line and len(line + piece.rstrip()) > width:
            lines.append(line.rstrip())
            line = ""
        while len(piece.rstrip()) > width:
            lines.append(piece[:width])
            piece = piece[width:]
        line += piece
    return [*lines, line.rstrip()] if line.strip() or not lines else lines


def wrap(text: str, width: int | None = WIDTH) -> list[str]:
    """A line of prose for people, wrapped at `width`; continuation lines are indented two spaces more than
    the text's own indent."""
    if width is None or len(text) <= width:
        return [text]
    indent = " " * (len(text) - len(text.lstrip(" ")))
    return textwrap.wrap(text, width, subsequent_indent=indent + "  ", break_on_hyphens=False) or [text]


def print_lines(console: Console, lines: Sequence[str], style: str | None = None) -> None:
    """Lines already laid out (`render`, `wrap`), printed as they are: rich neither wraps, pads nor
    highlights them."""
    for line in lines:
        console.print(line, style=style, markup=False, highlight=False, soft_wrap=True)


def unit(device: str) -> tuple[str, float]:
    """The time unit of a device kind and its size in microseconds: ms for the CPU models (their calls
    take milliseconds to seconds), us for CUDA kernels. One unit per kind, whatever the run measured, so
    that the same cell reads the same in every run, table, comparison and plot."""
    return ("ms", 1000.0) if device.split(":")[0] == "cpu" else ("us", 1.0)


def number(value: float) -> str:
    """A time or a per-call figure in at most 6 characters, with 3 significant digits where they fit."""
    if value < 1:
        return f"{value:.2f}" if value >= 0.01 else f"{value:.1g}"
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _time(t: Timing, scale: float = 1.0) -> str:
    return number(t.median_us / scale) + (NOISY if t.cv > DISPERSION_CV else "")


def cell(res: SelectorResult | None, scale: float = 1.0) -> str:
    """A cell of the wide table: the median (in units of `scale` us), or what happened, in words."""
    if res is None:
        return ""
    rerun = "" if res.determinism is None else f" {res.determinism.short()}"
    if res.status == "ok" and res.timing is not None:
        return _time(res.timing, scale) + rerun
    if res.status == "approximate" and res.timing is not None and res.damage is not None:
        return f"{_time(res.timing, scale)}{rerun} approximate, recall >= {res.damage.recall_min:.4f}"
    if res.status == "unsupported":
        return f"unsupported: {res.reason}"
    if res.status == "failed":
        recall = "" if res.damage is None else f", recall {res.damage.recall_min:.4f}"
        return f"FAILED: {res.reason} row {res.failures[0].row}{recall}"
    reason = res.reason or ""  # printed in full under the table
    return f"ERROR: {reason if len(reason) <= _CELL_CHARS else reason[:_CELL_CHARS - 3] + '...'}"


def short_cell(res: SelectorResult | None, scale: float = 1.0) -> str:
    """A cell of the narrow table: the median, or one word (the reasons follow the table)."""
    if res is None:
        return ""
    rerun = NONDETERMINISTIC if res.determinism is not None and not res.determinism.deterministic else ""
    if res.status == "ok" and res.timing is not None:
        return _time(res.timing, scale) + rerun
    if res.status == "approximate" and res.timing is not None:
        return _time(res.timing, scale) + APPROXIMATE + rerun
    if res.status == "failed" and res.damage is not None and res.failures[0].check == 3:
        return f"FAIL {res.damage.short()}"
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


def short_ids(keys: Sequence[tuple[str, int, int, int]]) -> list[str]:
    """Short ids of (case id, cols, rows, k), or the whole ids where two rows would read the same."""
    shorts = [(short_id(*k), *k[1:]) for k in keys]
    counts = Counter(shorts)
    return [s[0] if counts[s] == 1 else k[0] for s, k in zip(shorts, keys, strict=True)]


def _short_ids(cases: list[CaseResult]) -> list[str]:
    return short_ids([(c.case_id, c.cols, c.rows, c.top_k) for c in cases])


def _ratio_columns(result: ReplayResult) -> list[str]:
    """A ratio column for every other selector that was timed somewhere."""
    return [s for s in result.selectors if result.baseline and s != result.baseline
            and any(c.timed(s) is not None for c in result.cases)]


def _shape(case: CaseResult) -> list[str]:
    """cols, rows, k; `-` for a case whose shape was never read (incomplete or unreadable)."""
    known = case.cols or case.rows or case.top_k
    return [str(x) if known else "-" for x in (case.cols, case.rows, case.top_k)]


def _layout(result: ReplayResult, wide: bool, others: list[str]) -> list[str]:
    """The table's lines with ratio columns for `others` (see the module docstring for the layouts)."""
    scale = unit(result.device)[1]
    names = {s: s for s in result.selectors} if wide else short_names(result.selectors)
    floors = any(c.floor_us is not None for c in result.cases)
    cols = [Column("case", fold=True, least=16)]  # an id over more than 3 lines: rather fewer ratio columns
    cols += [Column(h, right=True) for h in (("logits cols", "query rows", "k") if wide else ("cols", "rows", "k"))]
    if wide:
        cols += [Column("source"), Column("DS fast path")]  # would vLLM route it to DeepSelect's fast path
    if floors:
        cols.append(Column(f"read floor {unit(result.device)[0]}" if wide else "floor", right=True))
    cols += [Column(names[name], right=True) for name in result.selectors]
    base = names.get(result.baseline or "", "")
    cols += [Column(f"{base}/{names[name]}" if wide else f"/{names[name]}", right=True) for name in others]
    ids = [c.case_id for c in result.cases] if wide else _short_ids(result.cases)
    rows = []
    for case, case_id in zip(result.cases, ids, strict=True):
        row = [case_id, *_shape(case)]
        if wide:
            row += [_source(case), "yes" if case.fast_path else f"no: {case.fast_path_note}"]
        if floors:
            row.append("" if case.floor_us is None else number(case.floor_us / scale))
        if case.invalid:
            row += [f"invalid: {case.invalid}" if wide else "invalid"] * len(result.selectors) + [""] * len(others)
        else:
            row += [(cell if wide else short_cell)(case.result(s), scale) for s in result.selectors]
            for name in others:
                r = ratio(case, result.baseline or "", name)
                row.append("" if r is None else f"{r:.2f}x")
        rows.append(row)
    return render(cols, rows, None if wide else WIDTH)


def table(result: ReplayResult, wide: bool = False) -> tuple[list[str], list[str]]:
    """The report's table as lines, and the ratio columns left out of the narrow one for lack of room
    (the last first: the legend names them, --wide shows them)."""
    others = _ratio_columns(result)
    for n in range(len(others), -1, -1):
        lines = _layout(result, wide, others[:n])
        if wide or max(map(len, lines)) <= WIDTH or n == 0:
            return lines, others[n:]
    raise AssertionError("unreachable")


def legend(result: ReplayResult, wide: bool = False, left_out: Sequence[str] = ()) -> list[str]:
    """What the narrow table's abbreviations, marks and one-word cells mean, why the cases it does not
    explain in its cells were not timed, and the ratio columns `left_out` for lack of room; the wide
    table needs only the marks."""
    lines = []
    cells = [r for c in result.cases for r in c.results]
    noisy = any(r.timing is not None and r.timing.cv > DISPERSION_CV for r in cells)
    if not wide:
        names = short_names(result.selectors)
        changed = [f"{short} = {name}" for name, short in names.items() if short != name]
        lines.append("case: id minus its cols/rows/k parts, which --case takes too (--wide: whole ids)")
        if changed:
            lines.append("selectors: " + ", ".join(changed))
        if _ratio_columns(result):
            base = names[result.baseline or ""]
            lines.append(f"/X: {base} time / X time (above 1: X is faster than {base})")
        if left_out:
            lines.append(f"not shown for lack of room: {', '.join('/' + names[n] for n in left_out)} (--wide shows "
                         "every column)")
        lines += _not_timed(result)
        lines += _fast_path(result)
    if any(r.status == "approximate" for r in cells):
        lines.append(f"{APPROXIMATE}: approximate: passed on the recall --tolerate-recall asks, not on exact values")
    lines += _determinism(result, wide)
    if noisy:
        lines.append(f"{NOISY}: the samples' CV is above {DISPERSION_CV:.0%}: compare with care, or use more --rounds")
    return lines


def _determinism(result: ReplayResult, wide: bool) -> list[str]:
    """With `--determinism N`: per selector, on how many cases its reruns were identical; the mark."""
    reruns = [(r.selector, r.determinism) for c in result.cases for r in c.results if r.determinism is not None]
    if not reruns:
        return []
    names = {s: s for s in result.selectors} if wide else short_names(result.selectors)
    parts = []
    for name in result.selectors:
        mine = [d for s, d in reruns if s == name]
        if mine:
            parts.append(f"{names[name]} {sum(d.deterministic for d in mine)}/{len(mine)}")
    runs = max(d.runs for _, d in reruns) - 1
    lines = [f"deterministic (identical index sets and order in {runs} reruns after timing), cases: " + ", ".join(parts)]
    if not wide and any(not d.deterministic for _, d in reruns):
        lines.append(f"{NONDETERMINISTIC}: its reruns returned other indices (details below)")
    return lines


def _not_timed(result: ReplayResult) -> list[str]:
    """One line per (selector, reason) an unsupported cell stands for; invalid cases with their reason."""
    unsupported = Counter((r.selector, r.reason) for c in result.cases for r in c.results if r.status == "unsupported")
    lines = [f"unsup: {sel} declined {n} case{'s' if n != 1 else ''}: {why}" for (sel, why), n in unsupported.items()]
    lines += [f"invalid: case {c.case_id}: {c.invalid.replace(f'case {c.case_id}: ', '', 1)}"
              for c in result.cases if c.invalid]  # the reason may name the case too
    failed = [r for c in result.cases for r in c.results if r.status == "failed"]
    if any(r.damage is None or r.failures[0].check != 3 for r in failed):
        lines.append("FAIL cN: verification check N failed (details below)")
    if any(r.damage is not None and r.failures[0].check == 3 for r in failed):
        lines.append("FAIL rX: check 3 failed (wrong values); X: the least recall of a row (damage below)")
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
    return [f"{result.device}: {result.clock_label}; medians in {unit(result.device)[0]}",
            result.protocol.describe()]


def print_report(result: ReplayResult, console: Console, wide: bool = False) -> None:
    """The heading, the table and its legend, then every failure in full (check, case, row, example),
    every error, and the notes; within WIDTH columns unless `wide`."""
    width = None if wide else WIDTH
    lines, left_out = table(result, wide)
    print_lines(console, [w for line in heading(result) for w in wrap(line, width)] + lines
                + [w for line in legend(result, wide, left_out) for w in wrap(line, width)])
    agreeing = agreement_table(result, wide)
    print_lines(console, [w for line in agreeing[:1] for w in wrap(line, width)] + agreeing[1:])
    for case in result.cases:
        for res in case.results:
            for f in res.failures:
                print_lines(console, wrap(f"FAILED {res.selector}: {f}", width), style="red")
            if res.damage is not None:
                what = "APPROXIMATE" if res.status == "approximate" else "DAMAGE"
                print_lines(console, wrap(f"{what} {res.selector} on case {case.case_id}: {res.damage}", width))
            if res.determinism is not None and not res.determinism.deterministic:
                print_lines(console, wrap(f"NONDETERMINISTIC {res.selector} on case {case.case_id}: "
                                          f"{res.determinism}", width), style="yellow")
            if res.status == "error":
                print_lines(console, wrap(f"ERROR {res.selector} on case {case.case_id}: {res.reason}", width),
                            style="red")
    for note in result.notes:
        print_lines(console, wrap(f"note: {note}", width))
    if result.partial is not None:
        print_lines(console, wrap(partial_line(result), width), style="bold yellow")


_POLICY = {"lowest": "lowest", "highest": "highest", "none observed": "none"}


def agreement_table(result: ReplayResult, wide: bool = False) -> list[str]:
    """The agreement of the timed selectors' index sets: per pair, the least fraction over cases of rows
    whose index sets agree, and each one's tie policy over the cases that offered a choice (ties.py).
    Empty where there is nothing to say: no case with a row whose k-th value ties, and every pair agreeing."""
    least: dict[tuple[str, str], float] = {}
    for case in result.cases:
        for a in case.agreement:
            least[(a.a, a.b)] = least[(a.b, a.a)] = min(a.rows, least.get((a.a, a.b), 1.0))
    choice = [c for c in result.cases if c.ties is not None and c.ties.rows_with_choice]
    if not least or (not choice and min(least.values()) == 1.0):
        return []
    names = [s for s in result.selectors if any(k[0] == s for k in least)]
    short = {s: s for s in names} if wide else short_names(result.selectors)
    rows = [[short[a], *("-" if a == b else f"{least[(a, b)]:.2f}" if (a, b) in least else "" for b in names)]
            for a in names]
    rows.append(["policy", *(_policy(result, s) for s in names)])
    most = max((c.ties.tied_max for c in choice if c.ties is not None), default=0)
    lines = [f"index sets: the least fraction of a case's rows on which two selectors agree; ties at the k-th "
             f"value leave a choice in {len(choice)} of {len(result.cases)} cases (at most {most} candidates "
             "tied in a row); policy: which tied candidates each takes (lowest, highest, none observed)"]
    return lines + render([Column(""), *(Column(short[s], right=True) for s in names)], rows,
                          None if wide else WIDTH)


def _policy(result: ReplayResult, selector: str) -> str:
    """One selector's tie policy over the cases: the one every case with a choice showed, else none."""
    seen = {r.tie_policy for c in result.cases for r in c.results if r.selector == selector and r.tie_policy}
    return "-" if not seen else _POLICY[seen.pop()] if len(seen) == 1 else "none"


def partial_line(result: ReplayResult) -> str:
    """What a partial report is: which signal stopped it, how many cases it holds of its run's."""
    p = result.partial or {}
    where = (p.get("outputs") or {}).get("json")
    resume = f"`logitreplay replay --resume {where}`" if where else "`logitreplay replay --resume R.json` (its JSON report)"
    return (f"PARTIAL: stopped by {p.get('signal')} after {p.get('cases_done')} of {p.get('cases_total')} cases; "
            f"the table and the files written hold the finished ones; {resume} replays the others")


CSV_FIELDS = ("case_id", "cols", "rows", "top_k", "dtype", "source", "selector", "status", "median_us",
              "p10_us", "p90_us", "cv", "samples", "ratio_to_baseline", "floor_us",
              # beyond right values (docs/design.md): recall where the values are wrong, determinism with
              # --determinism N, the case's ties at the k-th value, the selector's tie policy and agreement
              "recall_min", "recall_mean", "rows_affected", "max_deficit",
              "deterministic", "determinism_runs", "distinct_sets", "first_differing_row",
              "ties_rows_with_choice", "ties_max", "tie_policy", "agreement_min", "agreement",
              "reason", "partial")


def _beyond_values(case: CaseResult, res: SelectorResult) -> dict[str, Any]:
    """A CSV line's recall, determinism, tie and agreement cells (empty where the report has none): the
    JSON's `damage`, `determinism`, `tie_policy` and the case's `ties` and `agreement`, the latter as the
    least fraction and every pair with this selector, `other=fraction` separated by `;`."""
    line: dict[str, Any] = {}
    if res.damage is not None:
        d = res.damage
        line.update(recall_min=f"{d.recall_min:.4f}", recall_mean=f"{d.recall_mean:.4f}", rows_affected=d.rows,
                    max_deficit=f"{d.max_deficit:.6g}")
    if res.determinism is not None:
        r = res.determinism
        line.update(deterministic="yes" if r.deterministic else "no", determinism_runs=r.runs,
                    distinct_sets=r.distinct_sets, first_differing_row="" if r.first_row is None else r.first_row)
    if case.ties is not None:
        line.update(ties_rows_with_choice=case.ties.rows_with_choice, ties_max=case.ties.tied_max)
    line.update(tie_policy=res.tie_policy or "")
    pairs = [(a.b if a.a == res.selector else a.a, a.rows) for a in case.agreement if res.selector in (a.a, a.b)]
    if pairs:
        line.update(agreement_min=f"{min(f for _, f in pairs):.4f}",
                    agreement=";".join(f"{other}={f:.4f}" for other, f in pairs))
    return line


def write_csv(result: ReplayResult, path: Path) -> None:
    """One line per (case, selector); an invalid case gets one line per selector with its reason. A partial
    report (an interrupted run) says so on every line, so a file read alone never passes for a whole run."""
    p = result.partial or {}
    stopped = f"stopped by {p.get('signal')} after {p.get('cases_done')} of {p.get('cases_total')} cases" \
        if result.partial else ""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for case in result.cases:
            base = {"case_id": case.case_id, "cols": case.cols, "rows": case.rows, "top_k": case.top_k,
                    "dtype": case.dtype, "source": case.source,
                    "floor_us": "" if case.floor_us is None else f"{case.floor_us:.3f}"}
            for name in result.selectors:
                res = case.result(name)
                line: dict[str, Any] = {**base, "selector": name, "partial": stopped}
                if case.invalid:
                    line.update(status="invalid", reason=case.invalid)
                elif res is None:  # a partial report (an interrupted --isolate run) holds no result here
                    line.update(status="not run", reason="the run was stopped before this selector reached the case")
                else:
                    line.update(status=res.status, reason=res.reason or "", **_beyond_values(case, res))
                    if res.timing is not None:
                        t = res.timing
                        r = ratio(case, result.baseline or "", name) if result.baseline else None
                        line.update(median_us=f"{t.median_us:.3f}", p10_us=f"{t.quantile(0.1):.3f}",
                                    p90_us=f"{t.quantile(0.9):.3f}", cv=f"{t.cv:.4f}",
                                    samples=len(t.samples_us), ratio_to_baseline="" if r is None else f"{r:.4f}")
                w.writerow(line)


# Marks of the cells that have no bar, drawn at the foot of the axes in the selector's colour.
_MARKS = {"unsupported": ("x", "unsupported"), "failed": ("X", "failed or error"), "error": ("X", "failed or error")}


# The plot's width grows with its cases up to this many inches (1920 px at the PNG's 120 dpi); past it the
# case labels turn upright, then shrink, then only every n-th is written, so that no two ever overlap.
PLOT_MAX_WIDTH_IN = 16.0
_LABEL_SIZES = (7, 6, 5)


def plot_figure(result: ReplayResult) -> Any:
    """Grouped bars of median time per case and selector (log scale), p10-p90 as error bars (the title
    says so). Every selector keeps its own colour in the legend even where it has no bar; a cell that was
    not timed gets a mark at the foot of its bar's place (x: unsupported, X: failed or error). The width
    is bounded (`PLOT_MAX_WIDTH_IN`) and the case labels never overlap (`_fit_labels`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    cases = [c for c in result.cases if not c.invalid]
    name_of_unit, scale = unit(result.device)
    n = max(1, len(result.selectors))
    width = 0.8 / n
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(min(PLOT_MAX_WIDTH_IN, max(6.0, 1.2 * len(cases) + 2)), 4.8))
    handles: list[Any] = []
    shown_marks: dict[str, str] = {}
    for i, name in enumerate(result.selectors):
        colour = colours[i % len(colours)]
        xs, ys, lo, hi = [], [], [], []
        for j, case in enumerate(cases):
            x = j + (i - (n - 1) / 2) * width
            timing, res = case.timed(name), case.result(name)
            if timing is not None:
                m = timing.median_us / scale
                xs.append(x)
                ys.append(m)
                lo.append(m - timing.quantile(0.1) / scale)
                hi.append(timing.quantile(0.9) / scale - m)
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
    ax.set_xlim(-0.6, len(cases) - 0.4)
    ax.set_yscale("log")
    ax.set_xlabel("case (logits cols x query rows, k)")
    ax.set_ylabel(f"median time per call ({name_of_unit})")
    ax.set_title(f"{result.device}: {result.clock_label}\nbars: medians; error bars: p10-p90 of the samples",
                 fontsize=9)
    ax.legend(handles=handles, fontsize=8)
    _fit_labels(fig, ax, [(cid, f"{c.cols}x{c.rows}, k={c.top_k}") for cid, c in zip(_short_ids(cases), cases,
                                                                                       strict=True)])
    return fig


def _fit_labels(fig: Any, ax: Any, labels: Sequence[tuple[str, str]]) -> None:
    """Case labels that do not overlap: two centred lines under each case where they fit, else upright
    single lines, smaller, and at last only every n-th case's (the figure grows taller for upright ones)."""
    ax.set_xticklabels([f"{cid}\n{shape}" for cid, shape in labels], fontsize=_LABEL_SIZES[0], ha="center",
                       multialignment="center")
    fig.tight_layout()
    if not _overlapping(fig, ax):
        return
    fig.set_figheight(4.8 + 0.06 * max((len(c) + len(s) + 2 for c, s in labels), default=0))
    tries = [(1, size) for size in _LABEL_SIZES]
    tries += [(2 ** n, _LABEL_SIZES[-1]) for n in range(1, max(1, len(labels)).bit_length() + 1)]
    for every, size in tries:  # the last writes one label: it cannot overlap
        ax.set_xticklabels([f"{cid}  {shape}" if k % every == 0 else "" for k, (cid, shape) in enumerate(labels)],
                           fontsize=size, rotation=90, ha="center", va="top")
        fig.tight_layout()
        if not _overlapping(fig, ax):
            return


def _overlapping(fig: Any, ax: Any) -> bool:
    """Whether any two written tick labels of the x axis overlap on the drawn figure."""
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    return any(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:], strict=False))


def write_plot(result: ReplayResult, path: Path) -> None:
    """`plot_figure` in the format its extension names (`.png`, `.pdf`, `.svg`, ...), at exactly `path`."""
    import matplotlib.pyplot as plt

    fig = plot_figure(result)
    fig.savefig(path, dpi=120, format=path.suffix.lstrip(".").lower() or "png")
    plt.close(fig)
