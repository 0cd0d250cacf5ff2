"""ShardQ cases merged back into one case per step and layer: vLLM 0.34 splits a prefill step's rows across
its TP ranks (ShardQ, a zigzag of the rows), so each rank captures only its own rows, gathered, each case
saying in `row_positions` (runs of [first row, end row, first position]) where its rows sit in the step.

Together the ranks' cases of one layer in one step (`tensor_parallel.step`, counted alike on every rank)
hold every row of the step's prefill once: `merge_parts` rebuilds the one case a TP 1 run would have
captured, its rows in step order, each row's values, bounds and reference indices exactly as its rank
captured them, and every part's own facts (case id, rank, chunk, row positions, layout) in the
provenance (`shards`). Parts that do not tile the rows (a rank missing, a row twice, a gap) are never
merged: a merged case is complete or is not made. Each rank applies the capture policy on its own (its
matrices' widths can differ), so a rank may keep a step another skipped: by default such a group's parts
are copied as they are and named with the reason, and `strict` refuses the whole archive instead.
"""

from __future__ import annotations

import os
import shutil
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from logitreplay.archive.case import Case
from logitreplay.archive.store import Archive, CaseInfo
from logitreplay.errors import ArchiveError

SHARDQ = "shardq"
# Facts of one rank's capture that the merged case keeps per part (under `shards`), not at its top.
_PER_PART = ("row_positions", "rank", "created", "chunk", "tensor_parallel", "device")


def shardq_key(provenance: dict[str, Any]) -> tuple[str, int | None] | None:
    """The (layer, step) a ShardQ case's rows belong to, or None for a case that is not a ShardQ part."""
    tp = provenance.get("tensor_parallel")
    if not isinstance(tp, dict) or tp.get("row_sharding") != SHARDQ or "row_positions" not in provenance:
        return None
    return str(provenance.get("layer_name")), tp.get("step")


def shardq_groups(infos: Sequence[CaseInfo]) -> dict[tuple[str, int | None], list[str]]:
    """The complete ShardQ parts of an archive by (layer, step), in the archive's order."""
    groups: dict[tuple[str, int | None], list[str]] = defaultdict(list)
    for info in infos:
        key = shardq_key(info.provenance) if info.complete else None
        if key is not None:
            groups[key].append(info.case_id)
    return dict(groups)


def positions(case: Case) -> np.ndarray:
    """The step position of each row of a ShardQ part, from its `row_positions` runs."""
    out = np.full(case.rows, -1, dtype=np.int64)
    for first, end, start in case.attrs["row_positions"]:
        out[first:end] = np.arange(start, start + end - first)
    if (out < 0).any():
        raise ArchiveError(f"case {case.case_id}: field row_positions: row {int(np.argmax(out < 0))} has none")
    return out


def merge_parts(parts: Sequence[Case]) -> Case:
    """One case of every rank's rows of a layer's step, in step order (see the module docstring); raises
    `ArchiveError` (one line) unless the parts are one step's ShardQ rows of every rank, each row once."""
    if not parts:
        raise ArchiveError("no ShardQ cases to merge")
    first = parts[0]
    name = f"ShardQ cases {', '.join(p.case_id for p in parts)}"
    keys = {shardq_key(p.attrs) for p in parts}
    if len(keys) != 1 or None in keys:
        raise ArchiveError(f"{name}: not ShardQ parts of one layer in one step")
    for fieldname in ("top_k", "dtype", "kind"):
        if len({getattr(p, fieldname) for p in parts}) != 1:
            raise ArchiveError(f"{name}: their {fieldname} differ")
    sizes = {p.attrs["tensor_parallel"].get("tp_size") for p in parts}
    ranks = sorted(p.attrs["tensor_parallel"].get("tp_rank") for p in parts)
    (size,) = sizes if len(sizes) == 1 else (None,)
    if not isinstance(size, int) or sorted(set(ranks)) != list(range(size)):
        raise ArchiveError(f"{name}: hold TP ranks {ranks} of tp_size {sorted(sizes, key=str)}: every rank's "
                           "rows are needed")
    parts = sorted(parts, key=lambda p: int(p.attrs["tensor_parallel"]["tp_rank"]))
    first = parts[0]
    where = np.concatenate([positions(p) for p in parts])
    order = np.argsort(where, kind="stable")
    step_rows = where[order]
    if step_rows.size and not np.array_equal(step_rows, np.arange(step_rows[0], step_rows[0] + step_rows.size)):
        bad = int(np.argmax(step_rows != np.arange(step_rows[0], step_rows[0] + step_rows.size)))
        raise ArchiveError(f"{name}: do not tile the step's rows (position {int(step_rows[bad])} is "
                           f"{'repeated' if bad and step_rows[bad] == step_rows[bad - 1] else 'after a gap'})")
    part_of = np.concatenate([np.full(p.rows, i) for i, p in enumerate(parts)])[order]
    row_of = np.concatenate([np.arange(p.rows) for p in parts])[order]
    values = [parts[i].values[parts[i].offsets[r]:parts[i].offsets[r + 1]] for i, r in zip(part_of, row_of, strict=True)]
    starts = np.array([parts[i].row_starts[r] for i, r in zip(part_of, row_of, strict=True)], dtype=np.int32)
    ends = np.array([parts[i].row_ends[r] for i, r in zip(part_of, row_of, strict=True)], dtype=np.int32)
    refs = None
    if all(p.reference_indices is not None for p in parts):
        refs = np.stack([parts[i].reference_indices[r] for i, r in zip(part_of, row_of, strict=True)]) \
            if step_rows.size else np.zeros((0, first.top_k), dtype=np.int32)
    cols = max(p.cols for p in parts)
    lo = int(step_rows[0]) if step_rows.size else 0
    attrs = {k: v for k, v in first.attrs.items() if k not in _PER_PART}
    layouts = sorted({str(p.attrs.get("chunk", {}).get("layout")) for p in parts})
    attrs.update(
        chunk={"row_start": lo, "row_end": lo + int(step_rows.size), "layout": "/".join(layouts)},
        tensor_parallel={"tp_size": size, "row_sharded": False, "row_sharding": SHARDQ,
                         "merged_from_ranks": list(range(size)), "step": first.attrs["tensor_parallel"].get("step")},
        shards=[{"case_id": p.case_id, "cols": p.cols, "row_stride": p.row_stride,
                 **{k: p.attrs[k] for k in _PER_PART if k in p.attrs}} for p in parts],
    )
    storage = first.values.dtype
    merged = Case(f"{first.case_id}-tp{size}", np.concatenate(values).astype(storage, copy=False) if values
                  else np.zeros(0, storage), np.zeros(len(values) + 1, dtype=np.int64), starts, ends, first.top_k,
                  cols, max(p.row_stride for p in parts), first.dtype, refs, attrs)
    np.cumsum(merged.lengths, out=merged.offsets[1:])
    merged.validate()
    return merged


def merge_archive(source: Archive, target: str | os.PathLike[str],
                  strict: bool = False) -> tuple[int, int, list[str]]:
    """Write `target`, a new archive of `source`'s complete cases with each step's ShardQ parts merged
    into one case (`merge_parts`) and every other case as it is; returns (merged cases, parts merged, one
    line per group kept as its parts: its layer, step, case ids and why). With `strict`, a group that does
    not merge refuses the whole archive. `source` is only read; a refusal leaves no `target` behind."""
    out = Path(target)
    if out.exists():
        raise ArchiveError(f"{out}: exists; merge writes a new archive")
    groups = shardq_groups(source.infos())
    merged_ids: set[str] = set()
    kept: list[str] = []
    try:
        made = Archive.create(out, {k: v for k, v in source.attrs.items() if k != "logitreplay"}, exist_ok=False)
        for (layer, step), ids in groups.items():  # first: under strict, a refused group costs no copying
            try:
                case = merge_parts([source.read(cid) for cid in ids])
            except ArchiveError as err:
                if strict:
                    raise
                kept.append(f"{layer} step {step}: kept as {len(ids)} parts ({err})")
                continue
            made.write(case)
            merged_ids.update(ids)
        for cid in source.case_ids():
            if cid not in merged_ids:
                made.write(source.read(cid))
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise
    return len(groups) - len(kept), len(merged_ids), kept


__all__ = ["SHARDQ", "merge_archive", "merge_parts", "positions", "shardq_groups", "shardq_key"]
