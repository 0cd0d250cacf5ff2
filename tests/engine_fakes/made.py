"""The loader both engines' import hooks serve their stand-in modules with: the module is what a factory
makes of its name, and there is nothing to execute."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import types
from collections.abc import Callable


class Made(importlib.abc.Loader):
    def __init__(self, make: Callable[[str], types.ModuleType]) -> None:
        self._make = make

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._make(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        return None
