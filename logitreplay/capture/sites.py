"""An intercepted call site of a serving plugin (`Site`) and one call read from it (`Call`).

A `Site` names the attribute to wrap and where to find it; its `read` turns one production call's
arguments, its result and the calling frames into a `Call`: the tensors as the kernel saw them, still on
the device, and the facts a case records. Reading never syncs with the device. The engines' sites are
in `vllm_sites` and `sglang_sites`; `serving.EngineCapture` wraps them and stages the calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import torch

from logitreplay.capture.frames import Layer
from logitreplay.capture.writer import Finish


@dataclass
class Call:
    """One intercepted top-k call, as a case will record it. Tensors stay on the model's device."""

    matrix: torch.Tensor  # (rows, cols) view the kernel read
    starts: torch.Tensor  # (rows,) row bounds in the matrix's columns
    ends: torch.Tensor
    reference: torch.Tensor  # (rows, top_k) indices the production kernel wrote
    top_k: int
    row_stride: int
    layer: Layer
    requests: int | None  # None: counted by the writer from key_offsets (or distinct starts)
    key_offsets: torch.Tensor | None
    attrs: dict[str, Any]
    shard: dict[str, Any] | None = None  # TP row window: {"start", "stop", "sizes"}
    row_window: tuple[int, int] | None = None
    # Device tensors staged with the case, and the writer thread's host step over them (`CaptureWriter.submit`)
    extras: dict[str, torch.Tensor] | None = None
    finish: Finish | None = None


@dataclass(frozen=True)
class Site:
    """An intercepted call site: the attribute `name` wrapped on every object `targets()` returns, and
    `read(args, kwargs, result, caller_frame)` turning one call into a `Call` (None: not one it can
    capture, counted as such)."""

    name: str
    targets: Callable[[], list[Any]]
    read: Callable[[tuple[Any, ...], dict[str, Any], Any, FrameType | None], Call | None]
    source: str  # recorded as the cases' `index_source`
    path: str = "prefill"  # what the run summary counts its calls under (prefill, decode, deepselect, fused)
    # Why no call of this site can be captured (a kernel that builds no logits), or None: its calls are
    # counted as not capturable, with this reason, and never read.
    uncapturable: str | None = None
    # For a site whose calls take several paths (SGLang's one top-k entry serves decode, prefill and a
    # path that builds no logits): (path, why not capturable or None) from the caller's frame.
    paths: Callable[[FrameType | None], tuple[str, str | None]] | None = None

    def classify(self, frame: FrameType | None) -> tuple[str, str | None]:
        """The path a call is counted under and, where its calls hold nothing to capture, why."""
        return self.paths(frame) if self.paths is not None else (self.path, self.uncapturable)


__all__ = ["Call", "Site"]
