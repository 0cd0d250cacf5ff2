"""Selectors: the top-k protocol, the registry of names, and the bundled and upstream implementations.

`Selector` is the protocol (`supports` / `prepare` -> `Launch`); `build` makes one from a registered
name or a `package.module:factory` spec; `available` lists the names. See docs/selectors.md (and the
README's "Writing a selector") for the contract a plugin must keep.
"""

from logitreplay.errors import SelectorError
from logitreplay.selectors.base import Launch, Selector
from logitreplay.selectors.registry import BUILTINS, ENTRY_POINT_GROUP, available, build, load_factory

__all__ = ["BUILTINS", "ENTRY_POINT_GROUP", "Launch", "Selector", "SelectorError", "available", "build",
           "load_factory"]
