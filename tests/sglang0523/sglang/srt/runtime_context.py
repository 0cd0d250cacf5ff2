"""`sglang.srt.runtime_context.get_parallel()`: this process's ranks, as the scheduler process publishes
them (`tp_rank`, `tp_size`, and the attention data-parallel split `attn_tp_*`, `attn_dp_*`)."""

from __future__ import annotations

from typing import Any


class ParallelContext:
    def __init__(self) -> None:
        self._stamp: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._stamp:
            raise RuntimeError(f"parallel name {name!r} has not been written in this process.")
        return self._stamp[name]

    def override_permanently(self, **values: Any) -> None:
        self._stamp.update(values)

    def clear_stamp(self) -> None:
        self._stamp.clear()


_PARALLEL = ParallelContext()


def get_parallel() -> ParallelContext:
    return _PARALLEL
