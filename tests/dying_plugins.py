"""Selector plugins that take their whole process down, each the way foreign code does: `os._exit(0)`,
a segfault (a read of address 0), SIGKILL (what the OOM killer sends); and one that exhausts the memory
its process may have (an RLIMIT_AS set in its launch), which is only its own error. Each is the
reference selection until its launch runs, so every other selector's results stay comparable."""

from __future__ import annotations

import ctypes
import os
import resource
import signal

import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.reference import ReferenceSelector


class _Dying(ReferenceSelector):
    def __init__(self, name: str, end: object) -> None:
        self.name = name
        self._end = end

    def supports(self, case: Case, device: torch.device) -> str | None:
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        return self._end  # type: ignore[return-value]


def _exhaust_memory() -> None:
    """Lower this process's address-space limit just above what it maps now, then ask for 1 GiB."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (64 << 20), hard))
    try:
        bytearray(1 << 30)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def make_exits() -> _Dying:
    return _Dying("exits", lambda: os._exit(0))


def make_segfaults() -> _Dying:
    return _Dying("segfaults", lambda: ctypes.string_at(0))


def make_killed() -> _Dying:
    return _Dying("killed", lambda: os.kill(os.getpid(), signal.SIGKILL))


def make_out_of_memory() -> _Dying:
    return _Dying("out-of-memory", _exhaust_memory)
