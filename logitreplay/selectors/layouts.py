"""The index spaces that production's fused top-k calls write, built for a case, and the map back.

SGLang's and FlashInfer's DSA paths select and transform in one kernel: a selected column becomes a KV
slot through a page table (decode) or a column plus a per-row offset into the flattened ragged KV
(prefill). To time that very call and still verify it, an adapter builds the metadata for the case
once (in `prepare`) and its launch maps the kernel's output back to row-relative indices (-1 kept):
one elementwise pass over `rows * top_k` int32, part of the timed launch and named in the adapter's note.

- `page_table`: one table row per logit row (one request each, as in decode), `page_size` columns per
  entry; `identity` numbers the pages in order, `shuffled` draws a random permutation of all pages
  (slots scattered over the pool, as a long-running server's allocator leaves them).
- `ragged_offsets`: each row's base in a flattened KV of `cols` slots per row, rows in shuffled order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = ("identity", "shuffled")
INT32_SLOTS = 1 << 31


@dataclass(frozen=True)
class PageTable:
    """`table`: int32 (rows, pages) global page ids; `inverse[id]`: the flat position r * pages + j of
    page id `id` in the table."""

    table: torch.Tensor
    inverse: torch.Tensor
    page_size: int

    def map_back(self, slots: torch.Tensor, row_starts: torch.Tensor | None, out: torch.Tensor) -> None:
        """Write into `out` the row-relative column of each slot (-1 stays -1)."""
        rows, pages = self.table.shape
        page = torch.div(slots, self.page_size, rounding_mode="floor").clamp_(min=0)
        flat = self.inverse[page]
        base = torch.arange(rows, dtype=torch.int32, device=slots.device).mul_(pages)[:, None]
        cols = (flat - base) * self.page_size + torch.remainder(slots, self.page_size)
        if row_starts is not None:
            cols -= row_starts[:, None]
        out.copy_(torch.where(slots < 0, -1, cols))


def slots_fit(rows: int, cols: int) -> str | None:
    """Why a case's KV slots do not fit the int32 indices the fused kernels write, or None."""
    if rows * cols >= INT32_SLOTS:
        return f"{rows} x {cols} KV slots do not fit the int32 slot indices of the fused transform"
    return None


def page_table(rows: int, cols: int, page_size: int, layout: str, device: torch.device,
               seed: int = 0) -> PageTable:
    pages = -(-cols // page_size)
    n = rows * pages
    if layout == "identity":
        ids = torch.arange(n, dtype=torch.int32, device=device)
    else:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        ids = torch.randperm(n, generator=gen, dtype=torch.int64).to(device=device, dtype=torch.int32)
    inverse = torch.empty(n, dtype=torch.int32, device=device)
    inverse[ids.long()] = torch.arange(n, dtype=torch.int32, device=device)
    return PageTable(ids.view(rows, pages), inverse, page_size)


def ragged_offsets(rows: int, cols: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """int32 (rows,) bases r' * cols of the rows in a shuffled order r'."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    order = torch.randperm(max(rows, 1), generator=gen)[:rows]
    return (order * cols).to(device=device, dtype=torch.int32)


def unoffset(indices: torch.Tensor, offsets: torch.Tensor, out: torch.Tensor) -> None:
    """Write into `out` each index less its row's offset (-1 stays -1)."""
    out.copy_(torch.where(indices < 0, -1, indices - offsets[:, None]))


__all__ = ["LAYOUTS", "PageTable", "page_table", "ragged_offsets", "slots_fit", "unoffset"]
