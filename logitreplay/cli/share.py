"""`logitreplay export | import | push | pull | card`: moving cases between archives, safetensors files and
the Hugging Face Hub. Tokens come from the environment (`HF_TOKEN`) or `hf auth login`, never from the
command line, where other users of the machine could read them."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

import click

from logitreplay.archive import Archive
from logitreplay.archive.ids import check_globs, matches
from logitreplay.cli.common import (
    check_dir_target,
    check_file_target,
    emit_json,
    json_option,
    plural,
    user_errors,
)
from logitreplay.cli.names import complete_case_ids
from logitreplay.datasets import hub
from logitreplay.datasets.card import build_card
from logitreplay.datasets.export import case_id_of, export_case, read_file
from logitreplay.errors import ArchiveError


def _progress_only_on_terminal() -> None:
    """huggingface_hub's progress bars only on a terminal: logs and pipes stay clean."""
    if not sys.stderr.isatty():
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


@click.command("export")
@click.argument("location")
@click.option("--case", "case_globs", multiple=True, metavar="ID|GLOB", shell_complete=complete_case_ids,
              help="Only the complete cases whose id or short form matches, e.g. 'b-normal*' (repeatable; "
              "default: all).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Directory for the <case_id>.safetensors files.")
@click.option("--fill", type=float, default=-math.inf, show_default="-inf",
              help="Value of the cells outside each row's [start, end) (never data).")
@click.option("--overwrite", is_flag=True, help="Replace existing files of the same name.")
@json_option("The written files")
@user_errors
def export_cmd(location: str, case_globs: tuple[str, ...], out: Path, fill: float, overwrite: bool,
               json_out: str | None) -> None:
    """Write cases of an archive (directory, .zip or URL) as .safetensors files a kernel author loads with
    `safetensors.torch.load_file` alone."""
    check_dir_target(out, "--out")
    archive = Archive.open(location)
    known = [i for i in archive.infos() if i.complete]
    if not known:  # an export that writes nothing must not look like one that succeeded
        raise ArchiveError(f"{location}: no complete case to export")
    check_globs([i.case_id for i in known], case_globs, [i.short_id for i in known])
    written, damaged = [], []
    for info in (i for i in known if matches(i.case_id, case_globs, i.short_id)):  # a damaged case never stops the others
        try:
            case = archive.read(info.case_id)
        except ArchiveError as e:
            damaged.append(str(e).removeprefix("case "))
            continue
        written.append(str(export_case(case, out, fill, overwrite)))
    if json_out is not None:
        emit_json({"files": written, "damaged": damaged}, json_out)
    else:
        click.echo(f"wrote {plural(len(written), 'file')} to {out}")
    if damaged:
        raise ArchiveError(f"{plural(len(damaged), 'case')} not exported (damaged): {'; '.join(damaged)}")


@click.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Archive directory to write (created, or appended to).")
@click.option("--top-k", type=click.IntRange(min=1), default=None,
              help="top_k for files that record none (files from other tools).")
@json_option("The written case ids")
@user_errors
def import_cmd(files: tuple[Path, ...], out: Path, top_k: int | None, json_out: str | None) -> None:
    """Turn .safetensors files (from `export`, or any with a 2-D `logits` and `row_ends`/`ke`) into cases.

    Ids are checked from the headers before anything is written; then one file at a time is read,
    verified and written, so files larger than memory together import fine."""
    check_dir_target(out, "--out")
    ids = [case_id_of(f) for f in files]
    dup = next((i for i in ids if ids.count(i) > 1), None)
    if dup is not None:
        raise ArchiveError(f"case {dup}: given twice")
    present = {i.case_id for i in Archive.open(out).infos()} if (out / "zarr.json").is_file() else set()
    clash = next((i for i in ids if i in present), None)
    if clash is not None:
        raise ArchiveError(f"case {clash}: already in {out}")
    archive = None  # created once the first file has been read: a bad first file leaves nothing behind
    for n, f in enumerate(files):
        try:
            case = read_file(f, top_k)
            archive = archive or Archive.create(out)
            archive.write(case)
        except ArchiveError as e:
            raise ArchiveError(f"{e} ({plural(n, 'earlier file')} imported)" if n else str(e)) from None
    if json_out is not None:
        emit_json({"archive": str(out), "cases": ids}, json_out)
    else:
        click.echo(f"imported {plural(len(ids), 'case')} into {out}")


@click.command("push")
@click.argument("location")
@click.argument("repo_id")
@click.option("--private", is_flag=True, help="Create the dataset repo private (an existing repo keeps its setting).")
@click.option("--dry-run", is_flag=True, help="Stage the exact folder that would be uploaded and summarize it; "
              "upload nothing. The folder is kept only with --stage DIR.")
@click.option("--stage", "stage_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Staging folder (must be empty or absent; default: a temporary folder, removed afterwards).")
@click.option("--license", "license_id", default="cc-by-4.0", show_default=True, help="License on the card.")
@json_option("The result")
@user_errors
def push_cmd(location: str, repo_id: str, private: bool, dry_run: bool, stage_dir: Path | None,
             license_id: str, json_out: str | None) -> None:
    """Publish an archive as the Hub dataset REPO_ID (ORG/NAME): card + sharded archive, within the Hub's
    file-count limits. Prints the pinned hf:// URL that `replay` and `inspect` read."""
    hub.parse_ref(repo_id, revision_allowed=False)
    _progress_only_on_terminal()
    archive = Archive.open(location)
    if stage_dir is not None:
        check_dir_target(stage_dir, "--stage")
    staged = hub.stage(archive, repo_id, stage_dir, license=license_id)
    try:
        if dry_run:
            _dry_run_summary(staged, kept=stage_dir is not None, json_out=json_out)
            return
        pushed = hub.push(staged, repo_id, private=private)
    finally:
        if stage_dir is None:  # a temporary staging folder (a copy of the archive) never outlives the command
            shutil.rmtree(staged.path, ignore_errors=True)
    if json_out is not None:
        emit_json(pushed.to_json(), json_out)
    else:
        click.echo(f"pushed {plural(len(staged.cases), 'case')}: {pushed.url}")


def _dry_run_summary(staged: hub.Staged, kept: bool, json_out: str | None) -> None:
    if json_out is not None:
        emit_json({"dry_run": True, "kept": kept, **staged.to_json()}, json_out)
        return
    skipped = f"; skipped {len(staged.skipped_incomplete)} incomplete" if staged.skipped_incomplete else ""
    click.echo(f"staged {plural(len(staged.cases), 'case')}{skipped}, {plural(staged.files, 'file')}, "
               f"{staged.bytes} bytes (largest folder {staged.largest_folder[0]}: "
               f"{staged.largest_folder[1]} entries)")
    click.echo(str(staged.path) if kept else "(staged in a temporary folder, now removed; --stage DIR keeps it)")


@click.command("pull")
@click.argument("ref", metavar="REPO_ID[@REVISION]")
@click.option("--include", multiple=True, help="Only files matching this glob (repeatable), e.g. "
                                               "'cases/layer3-*/**'; the archive's root metadata always comes.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Target folder (default: datasets/downloads/ORG/NAME).")
@json_option("The result")
@user_errors
def pull_cmd(ref: str, include: tuple[str, ...], out: Path | None, json_out: str | None) -> None:
    """Download a Hub dataset at a pinned commit; everything is written inside the target folder."""
    _progress_only_on_terminal()
    if out is not None:
        check_dir_target(out, "--out")
    pulled = hub.pull(ref, out, include)
    if json_out is not None:
        emit_json(pulled.to_json(), json_out)
    else:
        click.echo(f"pulled {pulled.repo_id}@{pulled.revision} (commit {pulled.commit}) into {pulled.path}")


@click.command("card")
@click.argument("location")
@click.argument("repo_id")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), required=True, help="README.md to write.")
@click.option("--license", "license_id", default="cc-by-4.0", show_default=True, help="License on the card.")
@json_option("The card's path and its metadata (the YAML header)")
@user_errors
def card_cmd(location: str, repo_id: str, out: Path, license_id: str, json_out: str | None) -> None:
    """Write the dataset card `push` would publish for an archive (to keep a published card in git)."""
    hub.parse_ref(repo_id, revision_allowed=False)
    check_file_target(out, "--out")
    card = build_card(Archive.open(location), repo_id, license=license_id)
    card.save(out)
    if json_out is not None:
        emit_json({"card": str(out), "repo_id": repo_id, "metadata": card.data.to_dict()}, json_out)
    else:
        click.echo(str(out))


COMMANDS = (export_cmd, import_cmd, push_cmd, pull_cmd, card_cmd)
