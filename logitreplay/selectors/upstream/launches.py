"""The two launch shapes of production's fused top-k calls, written once: the index spaces they write,
built for a case in `prepare`, and the map back to row-relative indices inside the launch.

SGLang's and FlashInfer's DSA paths select and transform in one kernel: a selected column becomes a KV
slot through a page table (decode) or a column plus a per-row offset into the flattened ragged KV
(prefill). To time that very call and still verify it, an adapter builds the metadata for the case
once and its launch maps the kernel's output back (-1 kept): one elementwise pass over `rows * top_k`
int32, part of the timed launch and named in the adapter's note.

- `ragged`: each row's base in a flattened KV of `cols` slots per row, rows in shuffled order; the launch
  computes the row lengths on the device, calls the kernel, and subtracts the offsets.
- `paged`: one page-table row per logit row (one request each, as in decode), `page_size` columns per
  entry; `identity` numbers the pages in order, `shuffled` draws a random permutation of all pages
  (slots scattered over the pool, as a long-running server's allocator leaves them); the launch calls
  the kernel and maps each slot back through the table.

Every buffer the shapes use (lengths, the kernel's output where the call takes one, the map back's
scratch) is made in `prepare`: the map back allocates nothing. A call whose API returns a new tensor
(FlashInfer's) allocates it, as production does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from logitreplay.selectors.base import Launch

LAYOUTS = ("identity", "shuffled")
INT32_SLOTS = 1 << 31

# (lengths, offsets, indices) -> the indices written, in the ragged index space (`indices`, or the
# call's own output when its API allocates one).
RaggedCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
# (page table, slots) -> the slots written (`slots`, or the call's own output).
PagedCall = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class PageTable:
    """`table`: int32 (rows, pages) global page ids; `inverse[id]`: the flat position r * pages + j of
    page id `id` in the table."""

    table: torch.Tensor
    inverse: torch.Tensor
    page_size: int


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


def unoffsetter(offsets: torch.Tensor, out: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """A function writing into `out` each index less its row's offset (-1 stays -1), on buffers made now."""
    local = torch.empty(out.shape, dtype=torch.int32, device=out.device)
    missing = torch.empty(out.shape, dtype=torch.bool, device=out.device)

    def back(indices: torch.Tensor) -> None:
        torch.sub(indices, offsets[:, None], out=local)
        torch.lt(indices, 0, out=missing)
        local.masked_fill_(missing, -1)
        out.copy_(local)

    return back


def mapper(table: PageTable, out: torch.Tensor) -> Callable[[torch.Tensor], None]:
    """A function writing into `out` the row-relative column of each slot (-1 stays -1), on buffers made
    now."""
    rows, pages = table.table.shape
    base = torch.arange(rows, dtype=torch.int32, device=out.device).mul_(pages)[:, None]
    part = torch.empty(out.shape, dtype=torch.int32, device=out.device)
    cols = torch.empty(out.shape, dtype=torch.int32, device=out.device)
    missing = torch.empty(out.shape, dtype=torch.bool, device=out.device)

    def back(slots: torch.Tensor) -> None:
        torch.div(slots, table.page_size, rounding_mode="floor", out=part)
        part.clamp_(min=0)
        torch.index_select(table.inverse, 0, part.view(-1), out=cols.view(-1))
        cols.sub_(base).mul_(table.page_size)
        torch.remainder(slots, table.page_size, out=part)
        cols.add_(part)
        torch.lt(slots, 0, out=missing)
        cols.masked_fill_(missing, -1)
        out.copy_(cols)

    return back


def ragged(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, top_k: int, out: torch.Tensor,
           call: RaggedCall) -> Launch:
    """A ragged (prefill) call on offsets built for the case, its output less the offsets."""
    rows, cols = logits.shape
    offsets = ragged_offsets(rows, cols, logits.device)
    lengths = torch.empty_like(row_ends)
    indices = torch.empty((rows, top_k), dtype=torch.int32, device=logits.device)
    back = unoffsetter(offsets, out)

    def launch() -> None:
        torch.sub(row_ends, row_starts, out=lengths)
        back(call(lengths, offsets, indices))

    return launch


def paged(logits: torch.Tensor, top_k: int, out: torch.Tensor, layout: str, page_size: int,
          call: PagedCall) -> Launch:
    """A page-table (decode) call on a table of `layout` built for the case, its slots mapped back."""
    rows, cols = logits.shape
    table = page_table(rows, cols, page_size, layout, logits.device)
    slots = torch.empty((rows, top_k), dtype=torch.int32, device=logits.device)
    back = mapper(table, out)

    def launch() -> None:
        back(call(table.table, slots))

    return launch


__all__ = ["LAYOUTS", "PageTable", "PagedCall", "RaggedCall", "mapper", "page_table", "paged", "ragged",
           "ragged_offsets", "slots_fit", "unoffsetter"]
