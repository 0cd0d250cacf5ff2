"""The reference selector: masked `torch.topk`, on CPU or CUDA.

It defines the semantics every other selector is verified against (relative indices, -1 tails), so it is
written for obviousness rather than speed: cells outside `[start, end)` are masked below every value,
`topk` picks `top_k` per row, indices are shifted by the row start and the slots past
`min(top_k, end - start)` become -1. Masking to -inf is exact unless the data holds -inf itself (topk
could then take a masked cell over an in-range -inf); for such matrices the values become
order-preserving int64 keys and masked cells a key below every float. All buffers are allocated in
`prepare`; the launch only runs in-place and `out=` ops, and reads the bounds on the device, so on CUDA
it can be captured in a graph and replayed after the bounds change.
"""

from __future__ import annotations

import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Launch

# On CPU the masked copy is processed in row chunks of at most this many cells, so a full-scale case
# (4096 x 102400) does not need several GiB of scratch. On CUDA one chunk: one topk call, as users run it.
_CPU_CHUNK_CELLS = 1 << 24
# Below the key of every float32 (keys of floats span the int32 range).
_MASKED_KEY = -(1 << 40)


class ReferenceSelector:
    """Masked `torch.topk`: the semantics of vLLM's `top_k_per_row_prefill`, written plainly."""

    name = "reference"

    def supports(self, case: Case, device: torch.device) -> str | None:
        return None

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        rows, cols = logits.shape
        dev = logits.device
        # topk needs at least top_k columns: rows shorter than k are padded with masked (-inf) columns.
        width = max(cols, top_k)
        chunk = rows if dev.type == "cuda" else max(1, min(rows, _CPU_CHUNK_CELLS // max(width, 1)))
        chunk = max(chunk, 1)
        col = torch.arange(width, device=dev, dtype=torch.int32).unsqueeze(0)
        slot = torch.arange(top_k, device=dev, dtype=torch.int32).unsqueeze(0)
        starts = row_starts.unsqueeze(1)
        ends = row_ends.unsqueeze(1)
        # Decided over the whole matrix, not the current bounds, so a graph replayed after the bounds
        # changed stays exact.
        exact_keys = bool(torch.isneginf(logits).any())
        if exact_keys:
            as_float = torch.zeros((chunk, width), dtype=torch.float32, device=dev)
            flip = torch.empty((chunk, width), dtype=torch.int32, device=dev)
        selectable = torch.empty((chunk, width), dtype=torch.int64 if exact_keys else logits.dtype, device=dev)
        masked_value = _MASKED_KEY if exact_keys else float("-inf")
        outside = torch.empty((chunk, width), dtype=torch.bool, device=dev)
        scratch = torch.empty((chunk, width), dtype=torch.bool, device=dev)
        vals = torch.empty((chunk, top_k), dtype=selectable.dtype, device=dev)
        idx = torch.empty((chunk, top_k), dtype=torch.int64, device=dev)
        rel = torch.empty((chunk, top_k), dtype=torch.int32, device=dev)
        tail = torch.empty((chunk, top_k), dtype=torch.bool, device=dev)
        lengths = torch.empty((chunk, 1), dtype=row_ends.dtype, device=dev)
        spans = [(r0, min(rows, r0 + chunk)) for r0 in range(0, rows, chunk)]

        def launch() -> None:
            for r0, r1 in spans:
                n = r1 - r0
                sel, o, s = selectable[:n], outside[:n], scratch[:n]
                if exact_keys:
                    f, b = as_float[:n], as_float[:n].view(torch.int32)
                    f[:, :cols].copy_(logits[r0:r1])
                    # Order-preserving key: negative floats have their magnitude bits flipped.
                    torch.lt(b, 0, out=o)
                    torch.mul(o, 0x7FFFFFFF, out=flip[:n])
                    b.bitwise_xor_(flip[:n])
                    sel.copy_(b)
                else:
                    sel[:, :cols].copy_(logits[r0:r1])
                torch.lt(col, starts[r0:r1], out=o)
                torch.ge(col, ends[r0:r1], out=s)
                o.logical_or_(s)
                sel.masked_fill_(o, masked_value)
                v, i = vals[:n], idx[:n]
                torch.topk(sel, top_k, dim=1, out=(v, i))
                rel[:n].copy_(i)
                rel[:n].sub_(starts[r0:r1])
                torch.sub(ends[r0:r1], starts[r0:r1], out=lengths[:n])  # bounds are read at launch time
                torch.ge(slot, lengths[:n], out=tail[:n])
                rel[:n].masked_fill_(tail[:n], -1)
                out[r0:r1].copy_(rel[:n])

        return launch
