"""CUDA errors raised by selector code, contained so that a failing selector never takes the run down.

A CUDA error in a selector's verification, graph capture or timing ends that selector's result for that
case with a one-line reason, and the others go on. Some errors are *sticky*: an illegal address or a
device-side assert poisons the whole CUDA context (an aborted graph capture can also leave the stream
unusable), and every later CUDA call of the process fails. After any error from selector code the engine
probes the context (`context_lost`); when it is gone, `DeviceLost` carries the case's partial result
(the culprit's error) out of the engine, and the rest of the run (that case for the other selectors, and
every later case) continues in a fresh worker process (isolate.py), where that context cannot follow.
"""

from __future__ import annotations

import torch

from logitreplay.errors import LogitreplayError, one_line
from logitreplay.replay.results import CaseResult, SelectorResult


class DeviceLost(LogitreplayError):
    """The CUDA context of this process is lost: no more GPU work can run here. `result` is the
    selector result that found it (None when the timing of several selectors did), `partial` the case's
    result with that one selector result, set by the engine."""

    def __init__(self, reason: str, result: SelectorResult | None = None) -> None:
        super().__init__(reason)
        self.result = result
        self.partial: CaseResult | None = None


def context_lost(device: torch.device) -> str | None:
    """None when the device still runs work; else why not (the probe's own error, one line)."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        probe = torch.ones(1, device=device)
        probe.add_(1)
        if float(probe.item()) != 2.0:
            return "the device computed 1 + 1 wrong"
    except BaseException as e:  # the sticky error itself, or "operation not permitted when stream is capturing"
        return f"{type(e).__name__}: {one_line(e, 200)}"
    return None


def raise_if_lost(device: torch.device, result: SelectorResult | None = None) -> None:
    """After selector code raised: if the context is gone, mark `result` and raise `DeviceLost`."""
    why = context_lost(device)
    if why is None:
        return
    if result is not None:
        result.status = "error"
        result.reason = f"CUDA context lost: {result.reason or why}"[:300]
    raise DeviceLost(f"CUDA context lost ({why})", result)


__all__ = ["DeviceLost", "context_lost", "raise_if_lost"]
