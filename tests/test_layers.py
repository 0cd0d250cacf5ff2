"""The import rule of docs/design.md, checked on the source: imports run one way, and no file imports
itself back through others.

Layers, lowest first: errors < archive (the data model) < selectors < datasets < capture, replay < cli
< __main__ (`python -m logitreplay`).
A module may import its own layer's package and any lower layer; capture and replay never import each
other; nothing imports the CLI. Every import counts, including those inside functions: a lazy import
is still a dependency, only a later one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "logitreplay"

# Layer of each top-level part of the package (the first name after `logitreplay.`).
LAYER = {"errors": 0, "archive": 1, "selectors": 2, "datasets": 3, "capture": 4, "replay": 4, "cli": 5,
         "__main__": 6}  # `python -m logitreplay`, `torchrun -m logitreplay`: the command, on top
ROOT = "__init__"  # logitreplay/__init__.py re-exports the data model only


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports. `from pkg import mod` is an edge to `pkg.mod` alone: a
    package's `__init__` runs before any of its submodules anyway, so that is not a dependency on it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("logitreplay"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("logitreplay"):
            assert node.level == 0, f"{path}: relative import"
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(node.module)
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the project modules (files) it imports."""
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imports(path, set(files)) if m in files and m != name}
            for name, path in files.items()}


def part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ROOT


def forbidden(src: str, dst: str) -> str | None:
    """Why the edge src -> dst breaks the rule, or None."""
    a, b = part(src), part(dst)
    if a == b or b == ROOT:
        return None if b != ROOT or a == ROOT else "imports the package root"
    if a == ROOT:
        return None if LAYER[b] <= LAYER["archive"] else f"the package root imports {b}"
    if LAYER[b] > LAYER[a]:
        return f"{a} (layer {LAYER[a]}) imports {b} (layer {LAYER[b]})"
    if LAYER[b] == LAYER[a]:
        return f"{a} and {b} are separate stages of one layer"
    return None


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one file (Tarjan), as sorted module lists. A package's
    `__init__` importing its own submodules is not a cycle unless a submodule imports the `__init__`."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_every_top_level_part_has_a_layer() -> None:
    parts = {part(m) for m in graph()}
    assert parts - {ROOT} == set(LAYER), "a new top-level module needs a layer in tests/test_layers.py"


def test_imports_point_down_the_layers() -> None:
    bad = [f"{src} -> {dst}: {why}" for src, dsts in graph().items() for dst in sorted(dsts)
           if (why := forbidden(src, dst)) is not None]
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_files() -> None:
    assert cycles(graph()) == []


@pytest.mark.parametrize(("src", "dst", "allowed"), [
    ("logitreplay.replay.engine", "logitreplay.archive.case", True),
    ("logitreplay.replay.sources", "logitreplay.datasets.synth", True),
    ("logitreplay.archive.store", "logitreplay.datasets.hub", False),
    ("logitreplay.replay.engine", "logitreplay.capture.writer", False),
    ("logitreplay.selectors.base", "logitreplay.replay.verify", False),
    ("logitreplay.datasets.summary", "logitreplay.cli", False),
])
def test_the_rule_itself(src: str, dst: str, allowed: bool) -> None:
    assert (forbidden(src, dst) is None) == allowed


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
