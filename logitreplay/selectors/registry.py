"""The selector registry: names -> `module:factory`, for built-ins, upstream adapters and plugins.

Built-ins and adapters resolve lazily, so listing the names never builds a kernel or imports an upstream
package; plugins register under the `logitreplay.selectors` entry-point group, or are named directly
as `package.module:factory`.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from logitreplay.errors import SelectorError
from logitreplay.selectors.base import Selector
from logitreplay.selectors.external import EXTERNAL

ENTRY_POINT_GROUP = "logitreplay.selectors"

# Built-ins resolve lazily so that importing the registry never builds a kernel or imports an upstream.
BUILTINS: dict[str, str] = {
    "reference": "logitreplay.selectors.reference:ReferenceSelector",
    "native": "logitreplay.selectors.bundled:native",
    "deepselect": "logitreplay.selectors.bundled:deepselect",
}


def load_factory(spec: str) -> Callable[[], Selector]:
    """Resolve `package.module:attr` to a zero-argument factory (a class or a function)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SelectorError(f"selector {spec!r}: expected 'package.module:factory'")
    # Like `python -m`, resolve plugin modules from the working directory too (a console script's
    # sys.path lacks it), so `--selector mykernels.topk:make` works from a checkout.
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SelectorError(f"selector {spec!r}: cannot import {module_name} ({e})") from None
    try:
        factory = getattr(module, attr)
    except AttributeError:
        raise SelectorError(f"selector {spec!r}: {module_name} has no attribute {attr!r}") from None
    if not callable(factory):
        raise SelectorError(f"selector {spec!r}: {attr} is not callable")
    return factory


def build(spec: str) -> Selector:
    """Instantiate a selector from a registered name or a `module:factory` spec, checking the protocol."""
    factory = load_factory(available().get(spec, spec))
    try:
        sel = factory()
    except Exception as e:
        raise SelectorError(f"selector {spec!r}: factory raised {type(e).__name__}: {e}") from None
    if not isinstance(sel, Selector):
        raise SelectorError(f"selector {spec!r}: factory returned {type(sel).__name__}, which lacks "
                            "name/supports/prepare")
    return sel


def available() -> dict[str, str]:
    """Every registered name -> `module:factory`: built-ins, upstream adapters, entry-point plugins."""
    names = {**BUILTINS, **EXTERNAL}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names


__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "available", "build", "load_factory"]
