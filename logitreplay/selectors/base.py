"""The selector protocol every selector (built-in, upstream adapter or plugin) implements.

A selector is split in two so that timing measures the kernel alone: `prepare` may allocate, build and
inspect anything; the closure it returns only launches work that writes `out` (no allocation, no host
sync, no host read of the bounds), so on CUDA it can be captured once in a graph and replayed after the
bounds changed in place, as production does. A selector whose call depends on what the case records
beyond its tensors has `prepare_case(case, ...)` as well, and the engine gives it the case
(`prepare_for`; docs/selectors.md states both forms).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from logitreplay.archive import Case

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


def prepare_for(sel: Selector, case: Case, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
    """How the engine prepares a selector for `case`: an adapter whose call depends on what the case
    records beyond its tensors (vLLM's decode `next_n` and `max_seq_len`, the backend vLLM would pick)
    has `prepare_case(case, ...)` and is given the case, so it keeps nothing between `supports` and its
    launch; any other selector gets the protocol's `prepare`."""
    prepare_case = getattr(sel, "prepare_case", None)
    if callable(prepare_case):
        launch: Launch = prepare_case(case, logits, row_starts, row_ends, top_k, out)
        return launch
    return sel.prepare(logits, row_starts, row_ends, top_k, out)


__all__ = ["Launch", "Selector", "prepare_for"]
