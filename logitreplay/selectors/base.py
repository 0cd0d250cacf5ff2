"""The selector protocol every selector (built-in, upstream adapter or plugin) implements, and the registry.

A selector is split in two so that timing measures the kernel alone: `prepare` may allocate, build and
inspect anything; the closure it returns only launches work that writes `out` (no allocation, no host
sync, no host read of the bounds), so on CUDA it can be captured once in a graph and replayed after the
bounds changed in place, as production does.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

import torch

from logitreplay.archive import Case

ENTRY_POINT_GROUP = "logitreplay.selectors"

Launch = Callable[[], None]


@runtime_checkable
class Selector(Protocol):
    """Semantics (vLLM's `top_k_per_row_prefill`): for row r, write into `out[r]` the indices, relative
    to `row_starts[r]`, of the `top_k` largest of `logits[r, row_starts[r]:row_ends[r]]`, in any order,
    int32; when the row is shorter than `top_k`, every valid index, then -1 in the remaining slots."""

    name: str

    def supports(self, case: Case, device: torch.device) -> str | None:
        """None when this selector can run `case` on `device`, otherwise a short reason why not."""
        ...

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        """`logits`: (rows, cols) view whose stride(0) is the recorded row stride; bounds int32 on the
        same device; `out`: int32 (rows, top_k) view, possibly strided inside a larger buffer."""
        ...


class SelectorError(ValueError):
    """A selector could not be found or built (one line, names the selector)."""


# Built-ins resolve lazily so that importing the registry never builds a kernel or imports an upstream.
BUILTINS: dict[str, str] = {
    "reference": "logitreplay.selectors.reference:ReferenceSelector",
    "native": "logitreplay.selectors.dispatch:native",
    "deepselect": "logitreplay.selectors.dispatch:deepselect",
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
    names = dict(BUILTINS)
    try:
        from logitreplay.selectors.external import EXTERNAL
        names.update(EXTERNAL)
    except ImportError:
        pass
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        names.setdefault(ep.name, ep.value)
    return names
