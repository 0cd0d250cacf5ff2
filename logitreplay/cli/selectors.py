"""`logitreplay selectors`: every registered selector, whether it can run here and why not, and what it takes."""

from __future__ import annotations

import click

from logitreplay.cli.common import emit_json, json_option, plural, user_errors
from logitreplay.replay.report import Column, render, wrap
from logitreplay.selectors.listing import Listed, listing

_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}
_LAYOUT = {"decode": "d", "starts": "s", "padded": "p"}
_STATUS = {"not installed": "missing"}  # the table's short form, so that every name stays whole on its line


def _group(r: Listed) -> str:
    """The footnote an adapter shares with the others of its release and status: the package, what it
    was read from, the versions it takes, and the status's reason."""
    return (f"{r.package} (read from {r.read_from}, takes {r.accepts}): {r.status}, {r.why}")


@click.command("selectors")
@click.option("--check", is_flag=True,
              help="Load each adapter's kernel as a replay would (imports its package) and check its code "
                   "against this machine's GPU; default: look the packages up only.")
@json_option("Every selector with its status, reason, device, dtypes, k, layouts and versions")
@user_errors
def selectors_cmd(check: bool, json_out: str | None) -> None:
    """List every registered selector: installed or not and why, device, dtypes, top_k, row layouts, and
    the package version an adapter was read from and found."""
    rows = listing(check)
    if json_out is not None:
        emit_json({"selectors": [r.as_dict() for r in rows]}, json_out)
        return
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r.kind == "adapter":
            groups.setdefault(_group(r), []).append(r.name)
    notes = {text: i + 1 for i, text in enumerate(groups)}
    columns = [Column("selector"), Column("status"), Column("device"), Column("dtypes"),
               Column("k", fold=True, least=6), Column("rows"), Column("see", right=True)]
    cells = [[r.name, _STATUS.get(r.status, r.status), r.device.replace(", ", "+"),
              " ".join(_DTYPE.get(d, d) for d in r.dtypes) or "?", r.k,
              "".join(_LAYOUT.get(x, x) for x in r.layouts) or "?",
              str(notes[_group(r)]) if r.kind == "adapter" else "-" if r.kind == "built-in" else "plugin"]
             for r in rows]
    lines = render(columns, cells)
    lines += [w for text, n in notes.items() for w in wrap(f"{n}. {text}")]
    ok = sum(r.status == "ok" for r in rows)
    lines += [w for text in (
        f"{plural(len(rows), 'selector')}, {ok} usable here"
        f"{'.' if check else ' as far as their packages are found (--check loads them).'}",
        "status: missing = its package is not installed. rows: d = rows from column 0 (decode), s = rows "
        "starting anywhere (prefill chunks), p = a padded row stride. An adapter refuses a package version "
        "outside the range it takes.") for w in wrap(text)]
    click.echo("\n".join(lines))
