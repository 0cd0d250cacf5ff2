"""The one place production-kernel adapters are registered: every class of a module of this package that
carries its own `declared` (base.py). The registry's names, the split into processes, bench/peers.py's
columns (`columns`) and `logitreplay selectors` are all derived from what this returns, so adding an
adapter is one module here (and its test), nothing else.

Releases side by side: a folder holding one release of a package, as the staging scripts lay it out
(the package and its `NAME-VERSION.dist-info`), is a source for every adapter of that package that takes
its version (`NAME@FOLDER`, a column named after the folder); two releases of one package run in two
processes (registry.process_groups).

Importing the adapter modules imports torch and this package only: no upstream package is imported
until an adapter is asked to find its kernel.
"""

from __future__ import annotations

import functools
import importlib
import os
import pkgutil
from dataclasses import dataclass

from logitreplay.selectors.upstream.base import Declared, Upstream
from logitreplay.selectors.upstream.loading import dist_key, folder_versions, installed_version


@dataclass(frozen=True)
class Entry:
    """A registered adapter: its declaration and its factory (`module:Class`, called with the `@PATH`)."""

    declared: Declared
    factory: str


@functools.cache
def adapters() -> dict[str, Entry]:
    """Name -> entry, in name order, for every adapter declared in this package's modules."""
    package = __name__.rpartition(".")[0]
    found: dict[str, Entry] = {}
    for info in pkgutil.iter_modules([os.path.dirname(__file__)]):
        module = importlib.import_module(f"{package}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Upstream) and "declared" in obj.__dict__ \
                    and obj.__module__ == module.__name__:
                name = obj.declared.name
                if name in found:
                    raise RuntimeError(f"adapter {name!r} is declared twice ({found[name].factory}, "
                                       f"{module.__name__}:{obj.__qualname__})")
                found[name] = Entry(obj.declared, f"{module.__name__}:{obj.__qualname__}")
    return dict(sorted(found.items()))


def factories() -> dict[str, str]:
    """Name -> `module:Class`, the registry's view."""
    return {name: e.factory for name, e in adapters().items()}


def families() -> dict[str, str]:
    """Name -> the package or library family it loads: one family from two sources needs two processes."""
    return {name: e.declared.family for name, e in adapters().items()}


def staged(root: str | os.PathLike[str] | None) -> list[str]:
    """The folders directly under `root` that each hold a staged release (a `*.dist-info` in it), in name
    order; none when `root` is None or no folder."""
    if root is None or not os.path.isdir(root):
        return []
    return [p for p in sorted(os.path.join(root, n) for n in os.listdir(root))
            if os.path.isdir(p) and folder_versions(p)]


def columns(folders: list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every adapter's columns, in name order: `NAME` on the installed package, and `NAME@FOLDER` for each
    of `folders` holding a release of its package that it takes (in the order given). Where a release of
    its package is staged, the installed one gets a column only when its metadata names a version the
    adapter takes that no folder holds; a release an adapter was not read from gives it no column (its
    refusal would be all there is in it), but with nothing staged the installed package always has one
    (which says what is missing)."""
    held = {folder: folder_versions(folder) for folder in folders}
    specs: list[str] = []
    for name, entry in adapters().items():
        release = entry.declared.release
        key = dist_key(release.source.dist)
        staged = [(folder, got[key]) for folder, got in held.items() if key in got]
        installed = installed_version(release.source) if staged else None
        if not staged or (installed is not None and release.refuses(installed) is None
                          and installed not in {version for _, version in staged}):
            specs.append(name)
        specs += [f"{name}@{folder}" for folder, version in staged if release.refuses(version) is None]
    return specs


__all__ = ["Entry", "adapters", "columns", "factories", "families", "staged"]
