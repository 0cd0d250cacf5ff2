"""`logitreplay report R.json`: the replay table of a saved or merged report, and the report files every
replay command writes (`--csv`, `--plot`), each checked before any work starts.

A replay's table, CSV and plot come from its report alone, so a report written by `replay --json`, by
the ranks of a distributed replay or by `merge` prints the table `replay` printed and writes the same
files, without the run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import click
from rich.console import Console

from logitreplay.cli import decisions
from logitreplay.cli.common import check_file_target, plural, refuse_other_kind, user_errors
from logitreplay.replay import report
from logitreplay.replay.results import ReplayResult, ReportError, validate

# How an existing plot file of each format begins (a file of another kind is not written over); formats
# not listed here are written over as any file is.
_PLOT_MAGIC = {"png": (b"\x89PNG",), "pdf": (b"%PDF",), "svg": (b"<?xml", b"<svg"), "jpg": (b"\xff\xd8",),
               "jpeg": (b"\xff\xd8",), "eps": (b"%!PS",), "ps": (b"%!PS",)}


def read_report(path: Path) -> ReplayResult:
    """A `replay --json` (or `merge`) report, or a one-line `ReportError` naming the file: a file that is
    not JSON, or whose JSON does not match the report's schema, is refused before anything reads it."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise ReportError(f"{path}: not a replay report (not JSON text: a binary file)") from None
    try:
        data = json.loads(text)
        if isinstance(data, dict) and data.get("schema") == ReplayResult.SCHEMA:
            validate(data)
        return ReplayResult.from_json(data)
    except json.JSONDecodeError as e:
        raise ReportError(f"{path}: not a replay report (not JSON: {e})") from None
    except (KeyError, TypeError, AttributeError) as e:
        raise ReportError(f"{path}: not a replay report ({type(e).__name__}: {e})") from None
    except (ValueError, ReportError) as e:
        raise ReportError(f"{path}: {e}") from None


def plot_formats() -> dict[str, str]:
    """The file formats matplotlib writes (extension -> description)."""
    from matplotlib.backend_bases import FigureCanvasBase

    return FigureCanvasBase.get_supported_filetypes()


def check_outputs(csv_path: Path | None, plot_path: Path | None) -> None:
    """Refuse, before any work, a CSV or plot path that cannot be written or that names a file of another
    kind, and a plot whose extension names no format matplotlib writes (it is the format: a path without
    one is refused rather than written elsewhere)."""
    if csv_path is not None:
        first = f"{report.CSV_FIELDS[0]},".encode()
        refuse_other_kind(csv_path, "--csv", "replay CSV", lambda head: head.startswith(first))
        check_file_target(csv_path, "--csv")
    if plot_path is None:
        return
    if importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib: pip install 'logitreplay[plot]'")
    formats = plot_formats()
    suffix = plot_path.suffix.lower().lstrip(".")
    known = ", ".join(sorted(formats))
    if not suffix:
        raise click.BadParameter(f"{plot_path} has no extension to name its format (e.g. {plot_path}.png; "
                                 f"matplotlib writes {known})", param_hint="--plot")
    if suffix not in formats:
        raise click.BadParameter(f"{plot_path}: matplotlib does not write .{suffix} files (it writes {known})",
                                 param_hint="--plot")
    magic = _PLOT_MAGIC.get(suffix)
    if magic is not None:
        refuse_other_kind(plot_path, "--plot", suffix.upper(), lambda head: head.lstrip().startswith(magic))
    check_file_target(plot_path, "--plot")


def write_files(result: ReplayResult, csv_path: Path | None, plot_path: Path | None, err: bool = False) -> None:
    """Write the CSV and the plot that were asked for, each with a line naming the file written."""
    for path, what, write in ((csv_path, "CSV", report.write_csv), (plot_path, "plot", report.write_plot)):
        if path is not None:
            write(result, path)
            click.echo(f"{what} written to {path}", err=err)


def verdict(result: ReplayResult, strict: bool, console: Console) -> None:
    """Failures, errors and invalid cases: exit 1 under --strict, else a RESULTS FAILED line (exit 0)."""
    bad = report.problems(result)
    if not bad:
        return
    unusable = [b for b in bad if b.endswith(("(invalid)", "(incomplete)"))]  # every one is listed
    results = [b for b in bad if b not in unusable]
    listed = ", ".join(results[:5] + (["..."] if len(results) > 5 else []) + unusable)
    if strict:
        raise click.ClickException(f"--strict: {len(bad)} failed, errored or invalid: {listed}")
    report.print_lines(console, report.wrap(
        f"RESULTS FAILED ({plural(len(result.cases), 'case')} x {plural(len(result.selectors), 'selector')}): "
        f"{len(bad)} failed verification, raised, or were invalid: {listed} (exit status 0; --strict exits 1)"),
        style="bold red")


def console_for(stderr: bool) -> Console:
    """A console for the table: off a terminal (logs, pipes, CI) rich would wrap at 80 columns; give it
    room instead (the lines are laid out already)."""
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=220)


@click.command("report")
@click.argument("path", metavar="R.json", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--wide", is_flag=True, help="The full table (whole case ids, source, DS fast path reasons, "
              "unabbreviated names) instead of the one that fits 80 columns.")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write one line per case and selector.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write a bar plot; the extension names the format (.png, .pdf, .svg, ...).")
@click.option("--strict", is_flag=True, help="Exit 1 when the report holds a failed, errored or invalid result.")
@user_errors
def report_cmd(path: Path, wide: bool, csv_path: Path | None, plot_path: Path | None, strict: bool) -> None:
    """Print the replay table of a saved `replay --json` report (or a `merge`d one) as `replay` printed
    it, with its controls table, and write its CSV or plot."""
    check_outputs(csv_path, plot_path)
    result = read_report(path)
    console = console_for(stderr=False)
    report.print_report(result, console, wide)
    decisions.print_controls(result, console)
    write_files(result, csv_path, plot_path)
    verdict(result, strict, console)
