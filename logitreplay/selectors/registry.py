"""The selector registry: names -> `module:factory`, for built-ins, upstream adapters and plugins.

Built-ins and adapters resolve lazily, so listing the names never builds a kernel or imports an upstream
package; plugins register under the `logitreplay.selectors` entry-point group, or are named directly
as `package.module:factory`. The production-kernel adapters are those declared in selectors/upstream/
(catalog.py). Every one also takes its kernel from a path instead of the installed package: `vllm-native@/path/to/_C_stable_libtorch.abi3.so`, `sgl-fast-topk@/path/common_ops.abi3.so`,
`flashinfer-ragged@/folder/holding/flashinfer`.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import cast

from logitreplay.errors import SelectorError, one_line
from logitreplay.selectors.base import Selector
from logitreplay.selectors.upstream import catalog

ENTRY_POINT_GROUP = "logitreplay.selectors"

# Built-ins resolve lazily so that importing the registry never builds a kernel or imports an upstream.
BUILTINS: dict[str, str] = {
    "reference": "logitreplay.selectors.reference:ReferenceSelector",
    "native": "logitreplay.selectors.bundled:native",
    "deepselect": "logitreplay.selectors.bundled:deepselect",
    "split": "logitreplay.selectors.bundled:split",
    # the same kernels in their deterministic mode (lowest indices among ties, ascending index order)
    "native-det": "logitreplay.selectors.bundled:native_det",
    "deepselect-det": "logitreplay.selectors.bundled:deepselect_det",
    "split-det": "logitreplay.selectors.bundled:split_det",
    "auto": "logitreplay.selectors.auto:from_environment",  # dispatches by a measured rule (--rule)
}


def split_spec(spec: str) -> tuple[str, str | None]:
    """`name@/path/to/lib.so` -> (name, path); a spec without '@' -> (spec, None)."""
    name, sep, path = spec.partition("@")
    return (name, path) if sep and path else (spec, None)


def load_factory(spec: str) -> Callable[[], Selector]:
    """Resolve `package.module:attr` to a zero-argument factory (a class or a function)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SelectorError(unknown_name(spec))
    # Like `python -m`, resolve plugin modules from the working directory too (a console script's
    # sys.path lacks it), so `--selector mykernels.topk:make` works from a checkout.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as e:  # a relative name (TypeError), or a module that fails on import
        raise SelectorError(f"selector {spec!r}: cannot import {module_name} ({type(e).__name__}: "
                            f"{one_line(e)})") from None
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise SelectorError(f"selector {spec!r}: {module_name} has no attribute {attr!r}") from None
    if not callable(factory):
        raise SelectorError(f"selector {spec!r}: {attr} is not callable")
    return factory


def unknown_name(name: str) -> str:
    """The error for a name that is neither registered nor a `module:factory` spec: the closest
    registered name, and all of them."""
    names = sorted(available())
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return (f"unknown selector {name!r}: {hint}registered: {', '.join(names)} "
            "(or name a plugin as 'package.module:factory')")


def factory_spec(spec: str) -> str:
    """The `module:factory` behind a registered name, a `name@library-path`, or a plugin spec."""
    name, path = split_spec(spec)
    upstream = catalog.factories()
    if path is not None and name in upstream:
        return upstream[name]
    return available().get(spec, spec)


def _held(spec: str) -> dict[tuple[str, str], str]:
    """What a selector's kernel holds in its process, each with the source it comes from ("installed" or a
    path): its library or package family, and, where it imports its package (installed, or from a staged
    release's folder), the package's top module, which one process imports once."""
    name, path = split_spec(spec)
    entry = catalog.adapters().get(name)
    if entry is None:
        return {}
    where = os.path.abspath(path) if path else "installed"
    held = {("family", entry.declared.family): where}
    if path is None or os.path.isdir(path):
        held[("module", entry.declared.release.source.top)] = where
    return held


def process_groups(specs: list[str]) -> list[list[int]]:
    """The selectors (by index) that can share a process: no two sources of one library family or one
    package in a group (two builds of one op cannot be registered in one process, nor two copies of one
    package imported). Greedy, in order; one group when nothing clashes."""
    groups: list[tuple[list[int], dict[tuple[str, str], str]]] = []
    for i, spec in enumerate(specs):
        held = _held(spec)
        for members, holds in groups:
            if all(holds.get(key, where) == where for key, where in held.items()):
                members.append(i)
                holds.update(held)
                break
        else:
            groups.append(([i], dict(held)))
    return [members for members, _ in groups]


def needs_own_process(specs: list[str]) -> bool:
    """Whether these selectors load one package or library family from two sources (installed and a
    path, or two paths): they cannot all run in one process (`process_groups` splits them)."""
    return len(process_groups(specs)) > 1


def build(spec: str) -> Selector:
    """Instantiate a selector from a registered name, a `name@library-path` or a `module:factory` spec,
    checking the protocol."""
    name, path = split_spec(spec)
    factory = load_factory(factory_spec(spec))
    try:
        if path is not None and name in catalog.factories():
            sel = cast(Callable[[str], Selector], factory)(path)
        else:
            sel = factory()
    except (Exception, SystemExit) as e:  # foreign code: even its sys.exit() is its own failure
        raise SelectorError(f"selector {spec!r}: factory raised {type(e).__name__}: {one_line(e)}") from None
    if not isinstance(sel, Selector):
        raise SelectorError(f"selector {spec!r}: factory returned {type(sel).__name__}, which lacks "
                            "name/supports/prepare")
    if not isinstance(sel.name, str) or not sel.name:
        raise SelectorError(f"selector {spec!r}: its name must be a non-empty string (the report's column), "
                            f"got {sel.name!r}")
    return sel


def available() -> dict[str, str]:
    """Every registered name -> `module:factory`: built-ins, upstream adapters, entry-point plugins."""
    names = {**BUILTINS, **catalog.factories()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names


__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "available", "build", "factory_spec", "load_factory", "needs_own_process",
           "process_groups", "split_spec", "unknown_name"]
