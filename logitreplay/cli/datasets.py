"""`logitreplay synth` (write a control suite to an archive) and `logitreplay inspect` (what an archive
holds, and why a selector may be slow on it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.console import Console

from logitreplay.archive import Archive, Case
from logitreplay.archive.ids import check_globs, matches
from logitreplay.cli.common import check_dir_target, emit_json, json_option, plural, progress, user_errors
from logitreplay.cli.decisions import controls_option
from logitreplay.cli.names import complete_case_ids
from logitreplay.datasets import controls, synth
from logitreplay.datasets.summary import summarize
from logitreplay.errors import ArchiveError
from logitreplay.replay.report import WIDTH, Column, print_lines, render, short_ids, wrap
from logitreplay.replay.sources import describe_source


@click.command("synth")
@click.option("--suite", "suite_name", type=click.Choice(sorted(synth.SUITES)), default="seed-controls",
              show_default=True, metavar="NAME",
              help=f"Control suite to generate: {', '.join(sorted(synth.SUITES))}.")
@click.option("--scale", type=click.Choice(synth.SCALES), default="small", show_default=True,
              help="full: the published shapes; small: runs in seconds on a CPU (rows and columns / 8; "
                   "decode suites: widths and lengths / 32, batches / 4).")
@click.option("--out", "out", type=click.Path(path_type=Path), required=True, help="Archive directory to write.")
@click.option("--like", "like", default=None, metavar="ARCHIVE",
              help="Instead of a suite, write the --controls of every case of ARCHIVE (same shapes, bounds, "
              "dtype and top_k; deterministic seeds recorded), e.g. to share them without the real logits.")
@click.option("--controls", "control_kinds", callback=controls_option, default=None,
              metavar="KIND,...", help="With --like: which controls, any of matched, ablate, shuffle, indexer "
              "[default: matched,ablate,shuffle].")
@json_option("The written case ids")
@user_errors
def synth_cmd(suite_name: str, scale: str, out: Path, like: str | None, control_kinds: tuple[str, ...],
              json_out: str | None) -> None:
    """Write a deterministic synthetic control suite (each case carries its recipe) to an archive, or
    (--like) the controls of an archive's cases."""
    if control_kinds and like is None:
        raise click.BadParameter("--controls derives from real cases: give --like ARCHIVE", param_hint="--controls")
    check_dir_target(out, "--out")
    if like is not None:
        _synth_like(like, control_kinds or controls.DEFAULT_KINDS, out, json_out)
        return
    archive = Archive.create(out, attrs={"title": f"logitreplay {suite_name} ({scale})"})
    with archive.lock():  # a second synth into the same archive fails at once, in one line
        existing = set(archive.case_ids())
        recipes = synth.recipes(suite_name, scale)
        written = []
        for recipe in progress(recipes, len(recipes), f"synth {suite_name}"):
            if recipe.case_id in existing:
                continue
            # An incomplete case of the same id (a killed synth) is rewritten, never left in the way.
            archive.write(synth.generate(recipe), overwrite=True)
            written.append(recipe.case_id)
    if json_out is not None:
        emit_json({"archive": str(out), "written": written, "skipped": sorted(existing)}, json_out)
    else:
        click.echo(f"wrote {plural(len(written), 'case')} to {out}"
                   + (f" ({len(existing)} already there)" if existing else ""))


def _synth_like(like: str, kinds: tuple[str, ...], out: Path, json_out: str | None) -> None:
    source = Archive.open(like)
    archive = Archive.create(out, attrs={"title": f"logitreplay controls ({', '.join(kinds)}) of {source.location}"})
    existing = set(archive.case_ids())
    written: list[str] = []
    ids = source.case_ids()
    for case_id in progress(ids, len(ids), "synth --like"):
        real = source.read(case_id)
        for name in controls.derived_names(kinds):
            if controls.control_id(case_id, name) not in existing:
                archive.write(controls.derive(real, name))
                written.append(controls.control_id(case_id, name))
    if json_out is not None:
        emit_json({"archive": str(out), "written": written, "skipped": sorted(existing)}, json_out)
    else:
        click.echo(f"wrote {plural(len(written), 'control')} of {plural(len(ids), 'case')} to {out}"
                   + (f" ({len(existing)} already there)" if existing else ""))


@click.command("inspect")
@click.argument("location")
@click.option("--case", "case_globs", multiple=True, metavar="ID|GLOB", shell_complete=complete_case_ids,
              help="Only the cases whose id or short form matches, e.g. 'b-normal*' (repeatable; any may match).")
@json_option("Every field")
@click.option("--work", is_flag=True, help="Also run the CPU algorithm models and show their work per case "
              "(native: histogram passes; DeepSelect: buffer compactions, candidates, rows redone; split: "
              "histogram rounds, share of blocks that listed their bucket): why a selector is slow.")
@click.option("--wide", is_flag=True, help="Every column (whole case ids, layer, compression ratio, row "
              "lengths, value range) instead of the ones that fit 80 columns.")
@user_errors
def inspect_cmd(location: str, case_globs: tuple[str, ...], json_out: str | None, work: bool, wide: bool) -> None:
    """Summarize the cases of an archive (directory, .zip or URL): shape, storage, row lengths, value
    statistics over sampled rows (ties at the k-th value, fp16 bins of the top-k values) and provenance."""
    archive = Archive.open(location)
    infos = archive.infos()
    check_globs([i.case_id for i in infos], case_globs, [i.short_id for i in infos])
    infos = [i for i in infos if matches(i.case_id, case_globs, i.short_id)]
    summaries, sources = [], []
    for info in progress(infos, len(infos), "inspect"):
        case, invalid = None, info.attrs.get("error")
        if info.complete:
            try:
                case = archive.read(info.case_id)
            except ArchiveError as e:  # a damaged case is listed as such; the others are still inspected
                invalid = str(e)
        summaries.append({**summarize(info, case), "invalid": invalid, "nan_row": _nan_row(case)})
        sources.append("-" if case is None else describe_source(case))  # as `replay` names it
        if work:
            summaries[-1]["work"] = _work(case)
    if json_out is not None:
        emit_json({"archive": archive.location, "cases": summaries}, json_out, indent=1)
    else:
        _print_table(location, summaries, sources, work, wide)
    invalid = [s["case_id"] for s in summaries if s["invalid"]]
    if invalid:
        raise ArchiveError(f"{plural(len(invalid), 'case')} invalid: {', '.join(invalid)} (listed above)")


def _nan_row(case: Case | None) -> int | None:
    """The first row holding a NaN within its bounds: replay reports such a case invalid, never times it."""
    from logitreplay.replay.verify import nan_row

    return None if case is None else nan_row(case)


def _work(case: Case | None) -> dict[str, float] | None:
    """The models' work counters; None for incomplete cases and cases with NaN (invalid input)."""
    from logitreplay.replay.verify import nan_row
    from logitreplay.selectors.cpu_models import case_work

    if case is None or nan_row(case) is not None:
        return None
    return case_work(case)


def _work_cells(w: dict[str, float] | None, wide: bool) -> list[str]:
    if w is None:
        return ["-"] * len(_WORK_COLUMNS)
    mean = ".2f" if wide else ".1f"
    sep = " / " if wide else "/"
    return [f"{w['native_passes_mean']:{mean}}{sep}{w['native_passes_max']:.0f}",
            f"{w['deepselect_compactions_mean']:{mean}}{sep}{w['deepselect_compactions_max']:.0f}",
            f"{w['deepselect_appended_mean']:.0f}",
            f"{w['deepselect_redone_mean']:.0%}",
            f"{w['split_rounds_mean']:{mean}}{sep}{w['split_rounds_max']:.0f}",
            f"{w['split_listed_mean']:.0%}"]


# The --work columns (wide header, narrow header): native's histogram passes, DeepSelect's compactions,
# candidates and rows read twice (its first-round bet lost), split's rounds and the share of its blocks
# that listed their bucket (the fast path on spread scores).
_WORK_COLUMNS = (("native passes mean/max", "pass"), ("DS compactions mean/max", "comp"),
                 ("DS candidates/row", "cand"), ("DS redone", "redo"), ("split rounds mean/max", "round"),
                 ("split listed", "list"))
_WORK_LEGEND = ("pass: native's histogram passes, mean/max; comp, cand, redo: DeepSelect's buffer compactions "
                "mean/max, candidates per row, rows redone (its first-round bet lost); round, list: split's "
                "histogram rounds mean/max, share of its blocks that listed their bucket")
_DTYPE = {"float32": "fp32", "bfloat16": "bf16"}


def _fmt(x: Any, spec: str = "") -> str:
    return "-" if x is None else x if isinstance(x, str) else format(x, spec)


def _window(w: Any) -> str:
    """A TP rank's row window of a sharded vLLM chunk, after the layer name."""
    return f" (tp{w['tp_rank']} rows {w['start']}:{w['end']})" if isinstance(w, dict) else ""


def _print_table(location: str, summaries: list[dict[str, Any]], sources: list[str], work: bool,
                 wide: bool) -> None:
    """Within 80 columns the columns a reader compares cases by (shape, dtype, source, size, ties, bins;
    with --work, shape and the work counters); --wide: every column, whole ids."""
    sampled = max((s["values"]["sampled_rows"] for s in summaries if "values" in s), default=0)
    headers: list[Column] = [Column("case", fold=True)]
    headers += [Column(h, right=True) for h in ("rows", "cols", "k")]
    if wide:
        headers += [Column(h) for h in ("dtype", "source", "layer", "stored", "ratio", "row len min/med/max",
                                        "min / max", "k-th ties", "fp16 bins top-k")]
    elif not work:
        headers += [Column("dtype"), Column("source", fold=True), *(Column(h, right=True) for h in ("MiB", "ties",
                                                                                                  "bins"))]
    if work:
        headers += [Column(wide_name if wide else name, right=not wide) for wide_name, name in _WORK_COLUMNS]
    ids = [s["case_id"] for s in summaries] if wide else short_ids(
        [(s["case_id"], s.get("cols") or 0, s.get("rows") or 0, s.get("top_k") or 0) for s in summaries])
    rows, unusable = [], []
    for s, source, case_id in zip(summaries, sources, ids, strict=True):
        if "values" not in s:  # no shape to shorten its id by: the whole id, its reason below the table
            why = "INVALID (below)" if s["invalid"] else "INCOMPLETE (below)"
            unusable.append(f"{'invalid' if s['invalid'] else 'incomplete'}: {s['case_id']}: "
                            + (s["invalid"].removeprefix(f"case {s['case_id']}: ") if s["invalid"] else
                               "its writer did not finish; not data (`logitreplay repair` completes or removes it)"))
            cells = ["-"] * (len(headers) - 1)
            cells[-1 if wide or work else 4] = why  # in the last column, or in the narrow one's source
            rows.append([s["case_id"], *cells])
            continue
        v, rl = s["values"], s["row_length"]
        row = [case_id, str(s["rows"]), str(s["cols"]), str(s["top_k"])]
        mib = _fmt(s["stored_bytes"] and s["stored_bytes"] / 2**20, ".1f")
        if wide:
            row += [s["dtype"], source, str(s["layer"] or "-") + _window(s.get("row_window")), f"{mib} MiB",
                    _fmt(s["compression_ratio"], ".2f"), f"{rl['min']}/{rl['median']:.0f}/{rl['max']}",
                    f"{_fmt(v['min'], '.3g')} / {_fmt(v['max'], '.3g')}", _fmt(v["kth_ties_mean"], ".1f"),
                    _fmt(v["fp16_bins_top_mean"], ".0f")]
        elif not work:
            row += [_DTYPE.get(s["dtype"], s["dtype"]), source, mib, _fmt(v["kth_ties_mean"], ".1f"),
                    _fmt(v["fp16_bins_top_mean"], ".0f")]
        if work:
            row += _work_cells(s.get("work"), wide)
        rows.append(row)
    width = None if wide else WIDTH
    lines = [*wrap(f"{location}: {_counts(summaries)}", width), *render(headers, rows, width)]
    if not wide:
        lines.append("case: id minus its cols/rows/k parts (--wide: whole ids, every column)")
    if work:
        lines += wrap(_WORK_LEGEND, width)
    if wide or not work:
        ties, bins = ("k-th ties", "fp16 bins top-k") if wide else ("ties", "bins")
        lines += wrap(f"{ties}: values equal to the k-th, {bins}: fp16 bins of the top-k values, per row; means "
                      f"over up to {plural(sampled, 'sampled row')} per case" + ("; min / max over all values"
                                                                               if wide else ""), width)
    lines += [w for line in unusable for w in wrap(line, width)]
    lines += [w for s in summaries if s.get("nan_row") is not None for w in wrap(
        f"NaN: {s['case_id']}: a NaN inside row {s['nan_row']} (replay reports the case invalid input and never "
        "times it)", width)]
    print_lines(Console(), lines)


def _counts(summaries: list[dict[str, Any]]) -> str:
    """`12 cases: 9 readable, 1 invalid, 2 incomplete`: every row of the table counted once."""
    invalid = sum(bool(s["invalid"]) for s in summaries)
    incomplete = sum(not s["complete"] and not s["invalid"] for s in summaries)
    parts = [f"{len(summaries) - invalid - incomplete} readable"] + [f"{n} {what}" for n, what in (
        (invalid, "invalid"), (incomplete, "incomplete")) if n]
    return plural(len(summaries), "case") + (f": {', '.join(parts)}" if invalid or incomplete else "")
