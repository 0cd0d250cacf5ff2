"""The one place production-kernel adapters are registered: every class of a module of this package that
carries its own `declared` (base.py). The registry's names, the split into processes, bench/peers.py's
list of peers and `logitreplay selectors` are all derived from what this returns, so adding an adapter
is one module here (and its test), nothing else.

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


__all__ = ["Entry", "adapters", "factories", "families"]
