"""`logitreplay merge A.json B.json ... --out R.json`: one report from the reports of separate jobs;
`logitreplay merge CAPTURE.zarr --out MERGED.zarr`: a capture's ShardQ cases merged into one per step."""

from __future__ import annotations

from pathlib import Path

import click

from logitreplay.archive import Archive
from logitreplay.archive.shards import merge_archive
from logitreplay.cli.common import STDOUT, check_json_target, emit_json, json_option, plural, user_errors
from logitreplay.cli.report import read_report
from logitreplay.errors import ArchiveError
from logitreplay.replay.merge import merge_reports
from logitreplay.replay.results import write_json


@click.command("merge")
@click.argument("paths", nargs=-1, required=True, metavar="A.json B.json ... | CAPTURE.zarr",
                type=click.Path(path_type=Path, exists=True))
@click.option("--out", "out_path", required=True, type=click.Path(path_type=Path),
              metavar="R.json|MERGED.zarr", help="Where the merged report (or archive) goes.")
@click.option("--strict", is_flag=True,
              help="For a capture: refuse the archive when a step's ShardQ parts do not merge.")
@json_option("The merged report's file, its case count, the reports and GPUs it came from")
@user_errors
def merge_cmd(paths: tuple[Path, ...], out_path: Path, strict: bool, json_out: str | None) -> None:
    """Merge `replay --json` reports of disjoint cases made the same way (device kind, selectors,
    baseline, timing protocol) by separate jobs, e.g. a Slurm array over slices of the cases, into one
    report: the cases in the order of the files, and a ranks section that says which job, host and GPU
    timed each case. Reports of mixed protocols, or holding one case twice, are refused.

    Given one capture archive instead, write a new archive (--out, which must not exist) where the cases
    of vLLM 0.34's ShardQ (TP >= 2: each rank captured its share of a prefill step's rows) are merged
    into one case per layer and step, its rows in step order, and every other case is copied as it is.
    Parts that do not tile the step's rows (ranks keep steps by their own policy) are copied as they are,
    each such group named with the reason; --strict refuses the archive instead."""
    if any(p.is_dir() for p in paths):
        _merge_archive(paths, out_path, strict, json_out)
        return
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


def _merge_archive(paths: tuple[Path, ...], out_path: Path, strict: bool, json_out: str | None) -> None:
    if len(paths) != 1:
        raise ArchiveError("merge takes one capture archive (or only JSON reports)")
    merged, parts, kept = merge_archive(Archive.open(paths[0]), out_path, strict)
    total = len(Archive.open(out_path).case_ids())
    if json_out is not None:
        emit_json({"out": str(out_path), "cases": total, "shardq_merged": merged, "shardq_parts": parts,
                   "shardq_unmerged": kept}, json_out)
    if json_out != STDOUT:
        click.echo(f"{out_path}: {plural(total, 'case')}, {plural(merged, 'ShardQ case')} merged from "
                   f"{plural(parts, 'part')}")
        for line in kept:
            click.echo(f"not merged: {line}", err=True)
