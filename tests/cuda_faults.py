"""A selector whose launch raises a sticky CUDA error, for the containment tests.

`sticky()` triggers a device-side assert on CUDA (an index past the end of a tensor): the CUDA context of
its process is lost for good, as with an illegal memory access in a plugin's kernel. On CPU it raises the
same error text in the process whose id is in LR_TEST_LOSE_PID (the CPU tests make the engine believe the
context is then lost) and behaves like the reference elsewhere, so the fresh processes finish the run.
"""

from __future__ import annotations

import os

import torch

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
        if os.environ.get("LR_TEST_LOSE_PID") == str(os.getpid()):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return reference


def sticky() -> Sticky:
    return Sticky()

