"""The names a user types: `logitreplay cases` (the case ids of an archive or a built-in suite, one a line,
with their shapes) and the shell completion of case ids and selector names.

Completion is click's: `eval "$(_LOGITREPLAY_COMPLETE=bash_source logitreplay)"` (zsh_source, fish_source
for those shells) makes `--case`, `--selectors`, `--baseline` and `--selector` complete from the
archive or suite already named on the command line and from the selector registry. A completion
that cannot be had (an unreadable archive) offers nothing rather than an error."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import click
from click.shell_completion import CompletionItem

from logitreplay.archive import Archive
from logitreplay.archive.ids import check_globs, matches, short_id
from logitreplay.cli.common import emit_json, json_option, user_errors
from logitreplay.datasets import synth
from logitreplay.errors import LogitreplayError


@dataclass(frozen=True)
class CaseName:
    """A case as `cases` lists it: its id, the short form the 80-column tables show (which `--case` takes
    too), its shape, and whether it is data (`complete`; `why` says what it is otherwise)."""

    case_id: str
    short_id: str
    cols: int | None
    rows: int | None
    top_k: int | None
    dtype: str | None
    complete: bool = True
    why: str | None = None

    @property
    def shape(self) -> str:
        """`1024 x 512, k 512, float32` (cols x rows), or why the case is not data."""
        if not self.complete:
            return self.why or "incomplete"
        return f"{self.cols} x {self.rows}, k {self.top_k}, {self.dtype}"


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def case_names(location: str | None, suite: str | None, scale: str) -> list[CaseName]:
    """The cases of an archive (every group, complete or not, in natural order) or of a built-in suite."""
    if location is None:
        return [CaseName(r.case_id, short_id(r.case_id, r.cols, r.rows, r.top_k), r.cols, r.rows, r.top_k, r.dtype)
                for r in synth.recipes(suite or "seed-controls", scale)]
    out = []
    for info in Archive.open(location).infos():
        a = info.attrs
        why = None if info.complete else (str(a["error"]) if isinstance(a.get("error"), str) else
                                          "incomplete: its writer did not finish (`logitreplay repair`)")
        out.append(CaseName(info.case_id, info.short_id, _int(a.get("cols")), _int(a.get("rows")),
                            _int(a.get("top_k")), a.get("dtype") if isinstance(a.get("dtype"), str) else None,
                            info.complete, why))
    return out


def complete_case_ids(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion of `--case`: the ids (and short forms) of the archive or suite named so far."""
    params = ctx.params
    # the archive words: parsed, or (when click stopped at the option being completed) the words left over
    locations = params.get("locations") or ([params["location"]] if params.get("location") else ctx.args)
    suite = params.get("suite") or params.get("suite_name")
    scale = params.get("scale") or _default_scale()
    try:
        names = [n for loc in (locations or [None]) for n in case_names(loc, suite, scale)]
    except (LogitreplayError, OSError, ValueError):
        return []
    out = [CompletionItem(n.case_id, help=n.shape) for n in names
           if n.case_id.startswith(incomplete)]
    out += [CompletionItem(s) for s in dict.fromkeys(n.short_id for n in names)
            if s.startswith(incomplete) and s not in {n.case_id for n in names}]
    return out


def _default_scale() -> str:
    """The scale `replay` defaults to here (full on CUDA, small on a CPU)."""
    from logitreplay.replay.run import default_device

    return "full" if default_device() == "cuda" else "small"


def complete_selectors(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Shell completion of a selector name; in a comma-separated list (`--selectors a,b,`), of its last
    name, the names before it kept."""
    from logitreplay.selectors.registry import available

    head, _, last = incomplete.rpartition(",")
    prefix = f"{head}," if head else ""
    taken = set(head.split(",")) if head else set()
    return [CompletionItem(prefix + name) for name in sorted(available())
            if name.startswith(last) and name not in taken]


@click.command("cases")
@click.argument("location", required=False, metavar="[ARCHIVE]")
@click.option("--suite", type=click.Choice(sorted(synth.SUITES)), default=None, metavar="NAME",
              help=f"List a built-in suite's cases instead: {', '.join(sorted(synth.SUITES))} (default with "
              "no ARCHIVE: seed-controls).")
@click.option("--scale", type=click.Choice(synth.SCALES), default=None,
              help="The suite's scale [default: as replay's, small on a CPU, full on CUDA].")
@click.option("--case", "case_globs", multiple=True, metavar="ID|GLOB", shell_complete=complete_case_ids,
              help="Only the cases whose id or short form matches (repeatable; any may match).")
@json_option("Every case: id, short id, shape, dtype, complete")
@user_errors
def cases_cmd(location: str | None, suite: str | None, scale: str | None, case_globs: tuple[str, ...],
              json_out: str | None) -> None:
    """List the case ids of an archive (directory, .zip or URL) or of a built-in suite, one a line, with
    their shapes (cols x rows, k, dtype): the ids `--case` takes in every command, in the order replay
    reads them."""
    if location is not None and suite is not None:
        raise click.BadParameter("give an ARCHIVE or a --suite, not both", param_hint="--suite")
    names = case_names(location, suite, scale or _default_scale())
    check_globs([n.case_id for n in names], case_globs, [n.short_id for n in names])
    names = [n for n in names if matches(n.case_id, case_globs, n.short_id)]
    if json_out is not None:
        emit_json([asdict(n) for n in names], json_out)
        return
    width = max((len(n.case_id) for n in names), default=0)
    for n in names:
        click.echo(f"{n.case_id.ljust(width)}  {n.shape}")
