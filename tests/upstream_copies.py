"""Finds lines of this project that are identical to lines of the engines' released sources.

The project holds only code it wrote: facts about an engine (module paths, names, signatures, semantics)
carry over, its lines do not. A fake written from the facts shares the engine's import lines and
signatures (those are the facts) and, by chance, a few short or generic lines; a copied function shares
its body. So a line counts only if it is *non-trivial*: after whitespace is normalised it is not blank, a
comment, part of an import, a `def`/`class` header (signature lines included), a bare field declaration
(`name: type`) or a decorator, and it is at
least `MIN_CHARS` long and not only brackets and keywords (`return`, `pass`, `else:`, `)`, ...). A file
fails when more than `MAX_SHARED` of its non-trivial lines are identical to lines of an upstream file, or
when `RUN` of them in a row are (a copied block). A line that `COMMON` or more upstream files share is a Python
idiom and does not count. Each finding names file:line and the upstream file.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

MIN_CHARS = 24
MAX_SHARED = 8  # identical non-trivial lines a hand-written file may share by chance
RUN = 5  # consecutive identical non-trivial lines: a copied block whatever the file's total (the free-port idiom is 4)
COMMON = 3  # a line found in this many upstream files is an idiom (`deadline = time.monotonic() + 30`)
_TRIVIAL = re.compile(r"^[\s()\[\]{}:,.;=*\-+0-9'\"]*(?:(?:return|pass|else|try|finally|break|continue|raise|"
                      r"None|True|False|self|super|yield|async|await|lambda|not|and|or|in|is)\b[\s()\[\]{}:,.;]*)*$")


@dataclass(frozen=True)
class Shared:
    """A line of `path` (1-based `line`) identical to a line of the upstream file `upstream`."""

    path: Path
    line: int
    text: str
    upstream: str
    rank: int  # its position among the file's non-trivial lines (a copied block is a run of ranks)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.text!r} (also in {self.upstream})"


def normalise(line: str) -> str:
    return " ".join(line.split())


def _structural(source: str) -> set[int]:
    """1-based lines of imports, decorators and def/class headers (up to the body's first line)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) or (isinstance(node, ast.AnnAssign) and node.value is None):
            # imports, and a class's bare field declarations (`name: type`): its signature
            skip.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            body = node.body[0]
            start = body.lineno
            if isinstance(body, ast.Expr) and isinstance(body.value, ast.Constant) and len(node.body) > 1:
                start = node.body[1].lineno  # the docstring is prose: it is checked, the header is not
                skip.update(range(first, body.lineno))
            else:
                skip.update(range(first, start))
    return skip


def _comments(source: str) -> set[int]:
    """1-based lines holding only a comment."""
    lines: set[int] = set()
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and not source.splitlines()[token.start[0] - 1][: token.start[1]].strip():
                lines.add(token.start[0])
    except (tokenize.TokenError, SyntaxError, IndentationError):
        pass
    return lines


def significant(source: str) -> list[tuple[int, str]]:
    """(1-based line, normalised text) of the non-trivial lines of a Python source."""
    skip = _structural(source) | _comments(source)
    out = []
    for number, raw in enumerate(source.splitlines(), start=1):
        text = normalise(raw)
        if number in skip or len(text) < MIN_CHARS or text.startswith("#") or _TRIVIAL.match(text):
            continue
        out.append((number, text))
    return out


_HEADERS = ("import ", "from ", "def ", "async def ", "class ", "@", "#")


def index(files: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """Normalised upstream line -> the upstream files that have it (the first `COMMON`; their paths within
    the package, so that one file of two releases counts once). Upstream lines are filtered cheaply
    (length, trivial, and lines that start an import, a header or a decorator): an extra line here only
    matters if a line of ours, which is filtered exactly, equals it."""
    seen: dict[str, list[str]] = {}
    for name, source in files:
        for raw in source.splitlines():
            text = " ".join(raw.split())
            if len(text) < MIN_CHARS or text.startswith(_HEADERS) or _TRIVIAL.match(text):
                continue
            where = seen.setdefault(text, [])
            if len(where) < COMMON and name not in where:
                where.append(name)
    return seen


def shared(path: Path, source: str, upstream: dict[str, list[str]]) -> list[Shared]:
    """The non-trivial lines of `source` identical to an upstream line that fewer than `COMMON` upstream
    files have (a line in many is a Python idiom, not a sign of copying)."""
    found = []
    for rank, (n, text) in enumerate(significant(source)):
        where = upstream.get(text)
        if where and len(where) < COMMON:
            found.append(Shared(path, n, text, where[0], rank))
    return found


def copied(found: list[Shared]) -> bool:
    """Whether a file's shared lines are more than chance: too many, or a block of `RUN` in a row."""
    if len(found) > MAX_SHARED:
        return True
    ranks = sorted(f.rank for f in found)
    return any(ranks[i + RUN - 1] - ranks[i] == RUN - 1 for i in range(len(ranks) - RUN + 1))


__all__ = ["COMMON", "MAX_SHARED", "MIN_CHARS", "RUN", "Shared", "copied", "index", "normalise", "shared", "significant"]
