"""Selector plugins that take their whole process down, each the way foreign code does: `os._exit(0)`,
a segfault (a read of address 0), SIGKILL (what the OOM killer sends); and one that exhausts the memory
its process may have (an RLIMIT_AS set in its launch), which is only its own error, and one that keeps
all of it (`hoards`), which must cost the other selectors of its worker nothing. Each is the
reference selection until its launch runs, so every other selector's results stay comparable. Two end
their process the way a dead CUDA context can: `lingers` is the reference selection with a thread that
never ends (its process cannot exit by itself), and `unreapable` dies where nothing can reap it for a
while (it stops the fork server, its parent, then kills itself), as a process stuck in a driver's call
looks to the one waiting for it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import threading

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


class _Lingers(ReferenceSelector):
    name = "lingers"

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        threading.Thread(target=threading.Event().wait, name="never-ends").start()  # not a daemon
        return super().prepare(logits, row_starts, row_ends, top_k, out)


UNREAPABLE_PARENT = "LR_TEST_UNREAPABLE_PARENT"  # the file `unreapable` writes its parent's pid to
UNREAPABLE_FOR_S = 1.5  # how long the fork server stays stopped: longer than the test's EXIT_S + KILL_S


def _unreapable() -> None:
    parent = os.getppid()
    with open(os.environ[UNREAPABLE_PARENT], "w") as f:
        f.write(str(parent))
    # Resumed later by a process of its own, so that the run's next worker can be forked (the test also
    # resumes it when the run ends, should this one not have).
    subprocess.Popen(["sh", "-c", f"sleep {UNREAPABLE_FOR_S}; kill -CONT {parent}"], start_new_session=True)
    os.kill(parent, signal.SIGSTOP)
    os.kill(os.getpid(), signal.SIGKILL)


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


_HOARD: list[bytearray] = []


def _hoard_memory() -> None:
    """Take all the memory this process may have (an RLIMIT_AS just above what it maps) and keep it: the
    limit stays and so does every byte taken, as a leaking plugin leaves its process."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + (64 << 20), hard))
    with contextlib.suppress(MemoryError):
        while True:
            _HOARD.append(bytearray(1 << 20))
    raise MemoryError("hoarded every byte")


def make_exits() -> _Dying:
    return _Dying("exits", lambda: os._exit(0))


def make_segfaults() -> _Dying:
    return _Dying("segfaults", lambda: ctypes.string_at(0))


def make_killed() -> _Dying:
    return _Dying("killed", lambda: os.kill(os.getpid(), signal.SIGKILL))


def make_out_of_memory() -> _Dying:
    return _Dying("out-of-memory", _exhaust_memory)


def make_hoards() -> _Dying:
    return _Dying("hoards", _hoard_memory)


def make_lingers() -> _Lingers:
    return _Lingers()


def make_unreapable() -> _Dying:
    return _Dying("unreapable", _unreapable)


STALL_MARKER = "LR_TEST_STALL_MARKER"  # the file `stalls` creates when it starts stalling (once per marker)
STALL_CASE = "LR_TEST_STALL_CASE"  # the id of the case it stalls on


class _Stalls(ReferenceSelector):
    """The reference selection, except on the case `STALL_CASE` names while no `STALL_MARKER` file exists:
    there it creates the file and sleeps, so that a test can interrupt a run with a known part finished."""

    name = "stalls"

    def supports(self, case: Case, device: torch.device) -> str | None:
        self._case = case.case_id
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        marker = os.environ.get(STALL_MARKER)
        if marker and self._case == os.environ.get(STALL_CASE) and not os.path.exists(marker):
            open(marker, "w").close()
            threading.Event().wait(600)
        return super().prepare(logits, row_starts, row_ends, top_k, out)


def make_stalls() -> _Stalls:
    return _Stalls()
