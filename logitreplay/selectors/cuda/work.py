"""The bundled kernels' own account of their work, named as their CPU models name it.

A work build (`CudaKernel(work=True)`, build.WORK_FLAGS) keeps per row the counters its family's CPU model
counts (cpu_models: native's passes, DeepSelect's compactions and redone rows, split's rounds and parts).
`work_record` launches one on a case and names the counters by the model's fields, so that the GPU tests
compare the two field by field and bench/deepselect_bets.py reports the kernel's figures, not the model's.
Apart from kernels.py, so that reading a record is not part of the kernels' source digest."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import torch

from logitreplay.archive import Case
from logitreplay.selectors import cpu_models
from logitreplay.selectors.cuda.kernels import CudaKernel

# Each family's CPU model work, whose fields name the counters of its work record, in order.
WORK_FIELDS = {"native": cpu_models.NativeWork, "deepselect": cpu_models.DeepSelectWork,
               "split": cpu_models.SplitWork}


def work_record(kernel: CudaKernel, case: Case, device: torch.device | str) -> dict[str, np.ndarray]:
    """One launch of `kernel` (a work build) on `case`, padded as the replay pads it: counter name ->
    per-row counts."""
    logits = case.padded(device=device)
    starts, ends = (torch.from_numpy(a).to(logits.device) for a in (case.row_starts, case.row_ends))
    out = torch.empty((case.rows, case.top_k), dtype=torch.int32, device=logits.device)
    launch = kernel.prepare(logits, starts, ends, case.top_k, out)
    launch()
    record = launch.work(case.rows)  # synchronizes
    return {f.name: record[:, i] for i, f in enumerate(fields(WORK_FIELDS[kernel.name]))}
