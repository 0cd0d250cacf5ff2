"""A selector whose launch raises a sticky CUDA error, for the containment tests.

`sticky()` triggers a device-side assert on CUDA (an index past the end of a tensor): the CUDA context of
its process is lost for good, as with an illegal memory access in a plugin's kernel. On CPU it raises the
same error text in the first process that creates the file named by LR_TEST_LOSE_ONCE (in every process
under LR_TEST_LOSE_ALWAYS, as the CUDA error is), and makes the engine there believe the context is then
lost; it behaves like the reference elsewhere, so the fresh worker finishes the run.
"""

from __future__ import annotations

import os

import torch

from logitreplay.replay import cuda_errors
from logitreplay.selectors.base import Launch
from logitreplay.selectors.reference import ReferenceSelector


class Sticky(ReferenceSelector):
    name = "sticky"

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        reference = super().prepare(logits, row_starts, row_ends, top_k, out)
        if logits.device.type == "cuda":
            bad = torch.tensor([1 << 30], device=logits.device)
            src = torch.zeros(4, dtype=out.dtype, device=logits.device)

            def launch() -> None:
                out[0, :1] = src[bad]  # index out of range: device-side assert, sticky

            return launch
        if os.environ.get("LR_TEST_LOSE_ALWAYS") or _first_here(os.environ.get("LR_TEST_LOSE_ONCE")):
            cuda_errors.context_lost = lambda device: "RuntimeError: CUDA error: illegal address"
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return reference


def _first_here(marker: str | None) -> bool:
    """Whether this is the first process to ask (it creates `marker`), as the first to lose its context."""
    if not marker:
        return False
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def sticky() -> Sticky:
    return Sticky()

