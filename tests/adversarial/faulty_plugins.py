"""Selector plugins that fail the way foreign code does: hang, kill their process, return something
that is not a launch, write the wrong shape or dtype. Used with `replay --isolate`."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Launch


class _Faulty:
    def __init__(self, name: str, prepare_result: object = None) -> None:
        self.name = name
        self._prepare_result = prepare_result

    def supports(self, case: Case, device: torch.device) -> str | None:
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        return self._launch(out)  # type: ignore[no-any-return]

    def _launch(self, out: torch.Tensor) -> object:
        raise NotImplementedError


class _Hang(_Faulty):
    def _launch(self, out: torch.Tensor) -> object:
        return lambda: time.sleep(3600)


class _Segfault(_Faulty):
    def _launch(self, out: torch.Tensor) -> object:
        return lambda: os.kill(os.getpid(), signal.SIGSEGV)


class _NotALaunch(_Faulty):
    def _launch(self, out: torch.Tensor) -> object:
        return torch.zeros_like(out)


class _WrongShape(_Faulty):
    def _launch(self, out: torch.Tensor) -> object:
        return lambda: out.copy_(torch.zeros(out.shape[0], out.shape[1] + 1, dtype=torch.int32))


class _WrongDtype(_Faulty):
    def _launch(self, out: torch.Tensor) -> object:
        return lambda: out.copy_(torch.full(out.shape, 0.75, dtype=torch.float64))


def make_hang() -> _Faulty:
    return _Hang("hang")


def make_segfault() -> _Faulty:
    return _Segfault("segfault")


def make_not_a_launch() -> _Faulty:
    return _NotALaunch("not-a-launch")


def make_wrong_shape() -> _Faulty:
    return _WrongShape("wrong-shape")


def make_wrong_dtype() -> _Faulty:
    return _WrongDtype("wrong-dtype")


class _IllegalAccess(_Faulty):
    """A kernel storing far outside any allocation: the CUDA context of its process is lost for good."""

    def _launch(self, out: torch.Tensor) -> object:
        import triton
        import triton.language as tl

        @triton.jit
        def wild_store(ptr):  # type: ignore[no-untyped-def]
            tl.store(ptr + (1 << 40), 1)

        return lambda: wild_store[(1,)](out)


def make_illegal_access() -> _Faulty:
    return _IllegalAccess("illegal-access")


class _Correct:
    """The reference selection, then `after(logits, row_starts, row_ends, calls)` misbehaves."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.calls = 0

    def supports(self, case: Case, device: torch.device) -> str | None:
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        from logitreplay.selectors.reference import ReferenceSelector

        reference = ReferenceSelector().prepare(logits, row_starts, row_ends, top_k, out)

        def launch() -> None:
            self.calls += 1
            self._launch(reference, logits, row_starts, row_ends)

        return launch

    def _launch(self, reference: Launch, logits: torch.Tensor, row_starts: torch.Tensor,
                row_ends: torch.Tensor) -> None:
        reference()


class _ScribblesOnLogits(_Correct):
    def _launch(self, reference: Launch, logits: torch.Tensor, row_starts: torch.Tensor,
                row_ends: torch.Tensor) -> None:
        reference()
        logits[0, 0] = 1e9  # in place: the next selector would select it


class _ShrinksRowEnds(_Correct):
    def _launch(self, reference: Launch, logits: torch.Tensor, row_starts: torch.Tensor,
                row_ends: torch.Tensor) -> None:
        reference()
        row_ends.copy_(row_starts)


class _OnlyOnce(_Correct):
    """Does the work on the verified call only: every timed call returns at once."""

    def _launch(self, reference: Launch, logits: torch.Tensor, row_starts: torch.Tensor,
                row_ends: torch.Tensor) -> None:
        if self.calls == 1:
            reference()


class _Exits(_Correct):
    def _launch(self, reference: Launch, logits: torch.Tensor, row_starts: torch.Tensor,
                row_ends: torch.Tensor) -> None:
        sys.exit(0)


class _Interrupts(_Correct):
    def _launch(self, reference: Launch, logits: torch.Tensor, row_starts: torch.Tensor,
                row_ends: torch.Tensor) -> None:
        raise KeyboardInterrupt


SLOW_MARKER = "FAULTY_SLOW_MARKER"  # a file the slow launch creates once it sleeps (tests wait for it)


class _Slow(_Correct):
    def _launch(self, reference: Launch, logits: torch.Tensor, row_starts: torch.Tensor,
                row_ends: torch.Tensor) -> None:
        if os.environ.get(SLOW_MARKER):
            open(os.environ[SLOW_MARKER], "w").close()  # noqa: SIM115
        time.sleep(30)


def make_scribbles_on_logits() -> _Correct:
    return _ScribblesOnLogits("scribbles")


def make_shrinks_row_ends() -> _Correct:
    return _ShrinksRowEnds("shrinks-ends")


def make_only_once() -> _Correct:
    return _OnlyOnce("only-once")


def make_exits() -> _Correct:
    return _Exits("exits")


def make_interrupts() -> _Correct:
    return _Interrupts("interrupts")


def make_slow() -> _Correct:
    return _Slow("slow")


def make_none() -> None:
    return None


def make_raises() -> _Correct:
    raise RuntimeError("factory broke")


def make_exits_in_factory() -> _Correct:
    sys.exit(3)
