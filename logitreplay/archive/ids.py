"""Case ids as users name and read them: one order everywhere (natural: `c1024` before `c6400` before
`c12800`, as the built-in suites list their widths), one short form (what the 80-column tables show:
the id without the parts the cols/rows/k columns show beside it) and one way of choosing them (`--case`
globs, matched against the whole id and its short form, an exact id being a glob of itself), for every
command that lists or filters cases: an id read in any table is an id `--case` takes."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

from logitreplay.errors import ArchiveError

_DIGITS = re.compile(r"(\d+)")
SEPARATOR = "~"  # a derived case (a control) is named <real case id>~<suffix>


def natural_key(case_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key reading runs of digits as numbers (`a-c6400` < `a-c12800`); text parts sort as text."""
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in _DIGITS.split(case_id) if p)


def natural_order(case_ids: Iterable[str]) -> list[str]:
    return sorted(case_ids, key=natural_key)


def short_id(case_id: str, cols: int, rows: int, top_k: int) -> str:
    """The case id without its `c<cols>`, `w<cols>`, `r<rows>` and `k<top_k>` parts
    (`a-normal-c1024-r512-k512` -> `a-normal`, a capture's `run-00003-L00-w128` -> `run-00003-L00`); a
    control keeps its suffix (`a-normal~matched`); the whole id when nothing would be left."""
    base, sep, suffix = case_id.partition(SEPARATOR)
    shown = {f"c{cols}", f"w{cols}", f"r{rows}", f"k{top_k}"}
    kept = [part for part in base.split("-") if part not in shown]
    return "-".join(kept) + sep + suffix if kept else case_id


def matches(case_id: str, globs: Sequence[str], short: str | None = None) -> bool:
    """Whether `case_id`, or its `short` form, matches one of `globs` (any id when none is given)."""
    names = (case_id,) if short is None else (case_id, short)
    return not globs or any(fnmatch.fnmatchcase(name, g) for g in globs for name in names)


def check_globs(case_ids: Sequence[str], globs: Sequence[str], shorts: Sequence[str] | None = None) -> None:
    """A glob that matches none of the ids (nor of their `shorts`, when given, one per id) is an error, not
    an empty run or table."""
    for glob in globs:
        if not any(matches(cid, (glob,), None if shorts is None else shorts[i]) for i, cid in enumerate(case_ids)):
            raise ArchiveError(f"--case {glob}: matches none of the {len(case_ids)} case ids (e.g. "
                               f"{case_ids[0] if case_ids else '-'}; `logitreplay cases` lists them)")
