"""`logitreplay repair`: complete or remove the incomplete cases a killed writer left in an archive."""

from __future__ import annotations

from pathlib import Path

import click

from logitreplay.archive import Archive
from logitreplay.archive.repair import repair
from logitreplay.cli.common import emit_json, json_option, plural, user_errors


@click.command("repair")
@click.argument("archive_path", metavar="ARCHIVE", type=click.Path(path_type=Path))  # a file is the archive's one-line error
@click.option("--dry-run", is_flag=True, help="Say what would be completed or removed; change nothing.")
@json_option("Each incomplete case and its action")
@user_errors
def repair_cmd(archive_path: Path, dry_run: bool, json_out: str | None) -> None:
    """Complete or remove the incomplete cases of a directory archive (left by a killed capture, synth or
    import). A case whose every array is present and matches its recorded sha256 is marked complete;
    any other incomplete case is removed. Complete cases are never touched. Run it when no writer is
    writing to the archive (a second synth or repair is refused while one runs)."""
    steps = repair(Archive.open(archive_path, mode="a"), dry_run=dry_run)
    if json_out is not None:
        emit_json({"archive": str(archive_path), "dry_run": dry_run, "cases": [s.to_json() for s in steps]},
                  json_out)
        return
    if not steps:
        click.echo(f"{archive_path}: no incomplete cases")
        return
    verb = {"complete": "would complete" if dry_run else "completed",
            "remove": "would remove" if dry_run else "removed"}
    for step in steps:
        click.echo(f"{verb[step.action]} {step.case_id}: {step.reason}")
    done = sum(s.action == "complete" for s in steps)
    click.echo(f"{archive_path}: {plural(done, 'case')} {verb['complete']}, "
               f"{plural(len(steps) - done, 'case')} {verb['remove']}" + (" (dry run)" if dry_run else ""))
