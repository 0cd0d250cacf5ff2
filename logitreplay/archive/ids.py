"""Case ids as users name and read them: one order everywhere (natural: `c1024` before `c6400` before
`c12800`, as the built-in suites list their widths) and one way of choosing them (`--case` globs, an
exact id being a glob of itself), for every command that lists or filters cases."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Sequence

from logitreplay.errors import ArchiveError

_DIGITS = re.compile(r"(\d+)")


def natural_key(case_id: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key reading runs of digits as numbers (`a-c6400` < `a-c12800`); text parts sort as text."""
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in _DIGITS.split(case_id) if p)


def natural_order(case_ids: Iterable[str]) -> list[str]:
    return sorted(case_ids, key=natural_key)


def matches(case_id: str, globs: Sequence[str]) -> bool:
    """Whether `case_id` matches one of `globs` (any id when none is given)."""
    return not globs or any(fnmatch.fnmatchcase(case_id, g) for g in globs)


def check_globs(case_ids: Sequence[str], globs: Sequence[str]) -> None:
    """A glob that matches none of the ids is an error, not an empty run or table."""
    for glob in globs:
        if not any(fnmatch.fnmatchcase(cid, glob) for cid in case_ids):
            raise ArchiveError(f"--case {glob}: matches none of the {len(case_ids)} case ids (e.g. "
                               f"{case_ids[0] if case_ids else '-'})")
