"""Names a fake module does not define: imported fine, an error naming them when used (loader.Outside)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def outside_names(module: str) -> Callable[[str], Any]:
    """A module `__getattr__` answering every other name with an `Outside`."""
    from tests.engine_fakes.sglang.loader import Outside

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return Outside(f"{module}.{name}")

    return __getattr__
