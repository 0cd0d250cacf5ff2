"""`logitreplay repair`: complete or remove the incomplete cases a killed writer left in an archive."""

from __future__ import annotations

from pathlib import Path

import click

from logitreplay.archive import Archive
from logitreplay.archive.repair import repair
from logitreplay.cli.common import emit_json, json_option, plural, user_errors
from logitreplay.errors import ArchiveError


@click.command("repair")
@click.argument("archive_path", metavar="ARCHIVE", type=click.Path(path_type=Path))  # a file is the archive's one-line error
@click.option("--dry-run", is_flag=True, help="Say what would be completed or removed; change nothing.")
@click.option("--remove-damaged", is_flag=True, help="Also remove the complete cases that fail their checksums or "
              "checks (by default they are reported, left as they are, and the exit status is 1).")
@json_option("Each case acted on or found damaged, and its action")
@user_errors
def repair_cmd(archive_path: Path, dry_run: bool, remove_damaged: bool, json_out: str | None) -> None:
    """Complete or remove the incomplete cases of a directory archive (left by a killed capture, synth or
    import), and check the complete ones. An incomplete case whose every array is present and matches
    its recorded sha256 is marked complete; any other incomplete case is removed. A complete case that
    fails its checks is damaged: it is reported and left as it is (it may be recovered from where it came
    from), and repair exits 1; --remove-damaged removes it instead. Every case is read and verified, so
    this takes as long as reading the archive. Run it when no writer is writing to the archive (a second
    synth or repair is refused while one runs)."""
    steps = repair(Archive.open(archive_path, mode="a"), dry_run=dry_run, remove_damaged=remove_damaged)
    damaged = [s.case_id for s in steps if s.action == "damaged"]
    if json_out is not None:
        emit_json({"archive": str(archive_path), "dry_run": dry_run, "cases": [s.to_json() for s in steps]},
                  json_out)
    elif not steps:
        click.echo(f"{archive_path}: no incomplete or damaged cases")
    else:
        for step in steps:
            click.echo(f"{_VERBS[step.action][dry_run]} {step.case_id}: {step.reason}")
        counts = [(n, action) for action in ("complete", "remove", "damaged")
                  if (n := sum(s.action == action for s in steps))]
        said = [f"{plural(n, 'case') if i == 0 else n} {_COUNTED[action][dry_run]}" for i, (n, action) in enumerate(counts)]
        click.echo(f"{archive_path}: {', '.join(said)}" + (" (dry run)" if dry_run else ""))
    if damaged:
        it, are = ("it", "is") if len(damaged) == 1 else ("them", "are")
        raise ArchiveError(f"{plural(len(damaged), 'complete case')} damaged, left as {it} {are}: {', '.join(damaged)} "
                           f"(replay reports {it} invalid; --remove-damaged removes {it})")


# What is said of each step (done, or in a dry run), and of each count in the summary line.
_VERBS = {"complete": ("completed", "would complete"), "remove": ("removed", "would remove"),
          "damaged": ("left as it is", "would leave as it is")}
_COUNTED = {"complete": ("completed", "would be completed"), "remove": ("removed", "would be removed"),
            "damaged": ("damaged", "damaged")}
