"""`logitreplay merge A.json B.json ... --out R.json`: one report from the reports of separate jobs."""

from __future__ import annotations

from pathlib import Path

import click

from logitreplay.cli.common import STDOUT, check_json_target, emit_json, json_option, plural, user_errors
from logitreplay.cli.report import read_report
from logitreplay.replay.merge import merge_reports
from logitreplay.replay.results import write_json


@click.command("merge")
@click.argument("paths", nargs=-1, required=True, metavar="A.json B.json ...",
                type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--out", "out_path", required=True, type=click.Path(path_type=Path, dir_okay=False),
              metavar="R.json", help="Where the merged report goes.")
@json_option("The merged report's file, its case count, the reports and GPUs it came from")
@user_errors
def merge_cmd(paths: tuple[Path, ...], out_path: Path, json_out: str | None) -> None:
    """Merge `replay --json` reports of disjoint cases made the same way (device kind, selectors,
    baseline, timing protocol) by separate jobs, e.g. a Slurm array over slices of the cases, into one
    report: the cases in the order of the files, and a ranks section that says which job, host and GPU
    timed each case. Reports of mixed protocols, or holding one case twice, are refused."""
    check_json_target(out_path, "--out")
    merged = merge_reports([(str(p), read_report(p)) for p in paths])
    write_json(merged, out_path)
    gpus = sorted({str(r["gpu"]) for r in merged.ranks if r["gpu"]})
    if json_out is not None:
        emit_json({"out": str(out_path), "cases": len(merged.cases), "reports": [str(p) for p in paths],
                   "gpus": gpus}, json_out)
    if json_out != STDOUT:
        click.echo(f"{out_path}: {plural(len(merged.cases), 'case')} from {plural(len(paths), 'report')}"
                   + (f" ({', '.join(gpus)})" if gpus else ""))
