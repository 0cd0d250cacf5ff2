"""Per-case summaries for `logitreplay inspect`: shape, storage, row lengths, and the value statistics
that predict selector cost (exact ties at the k-th value; how many fp16 histogram bins the top-k values
of a row fall into, which is what makes the native radix select need extra passes), over sampled rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from logitreplay.archive import CASE_ARRAYS, Case, CaseInfo
from logitreplay.selectors.cpu_models import f16_bin

# Rows sampled for value statistics: enough for stable means, cheap on a 100k-column case.
SAMPLE_ROWS = 64


def kth_tie_mask(values: torch.Tensor, inside: torch.Tensor, kth: torch.Tensor) -> torch.Tensor:
    """Which in-bounds cells of `values` (rows, cols) equal their row's k-th largest value `kth` (rows,):
    the candidates tied at the k-th value, among which a selection may take any (-0.0 equals 0.0, as in
    verification). Shared by `inspect` and replay's tie report, so that both count the same ties."""
    return inside & (values.float() == kth.unsqueeze(1))


def value_stats(case: Case) -> dict[str, Any]:
    """Min/max over all values; ties at the k-th value and fp16 bins of the case's top-k values, over up to
    `SAMPLE_ROWS` evenly spaced non-empty rows (`sampled_rows` says how many)."""
    v = case.torch_values().float()
    out: dict[str, Any] = {"min": None, "max": None, "kth_ties_mean": None, "fp16_bins_top_mean": None,
                           "nan": int(torch.isnan(v).sum()), "sampled_rows": 0}
    if v.numel() == 0:
        return out
    seen = v[~torch.isnan(v)]  # NaN is counted above; min and max are of the other values
    if seen.numel():
        out["min"], out["max"] = _json_float(float(seen.min())), _json_float(float(seen.max()))
    lengths = case.lengths
    candidates = np.flatnonzero(lengths > 0)
    if candidates.size == 0:
        return out
    rows = candidates[np.linspace(0, candidates.size - 1, min(SAMPLE_ROWS, candidates.size)).astype(np.int64)]
    ties, bins = [], []
    for r in np.unique(rows):
        row = case.row(int(r)).float()
        top = torch.topk(row, min(case.top_k, row.numel())).values
        bins.append(int(torch.unique(f16_bin(top)).numel()))
        if row.numel() >= case.top_k:
            tied = kth_tie_mask(row.unsqueeze(0), torch.ones_like(row, dtype=torch.bool).unsqueeze(0),
                                top[case.top_k - 1:case.top_k])
            ties.append(int(tied.sum()) - 1)
    out["sampled_rows"] = len(bins)
    out["fp16_bins_top_mean"] = float(np.mean(bins))
    out["kth_ties_mean"] = float(np.mean(ties)) if ties else None
    return out


def _json_float(x: float) -> float | str:
    """`x`, or "inf" / "-inf": infinite logits are legal, and JSON has no number for them."""
    return x if np.isfinite(x) else ("inf" if x > 0 else "-inf")


def summarize(info: CaseInfo, case: Case | None) -> dict[str, Any]:
    """One case's summary; `case` is None for incomplete cases (listed, never read as data)."""
    a = info.attrs
    prov = info.provenance
    out: dict[str, Any] = {
        "case_id": info.case_id,
        "complete": info.complete,
        "rows": a.get("rows"),
        "cols": a.get("cols"),
        "top_k": a.get("top_k"),
        "dtype": a.get("dtype"),
        "row_stride": a.get("row_stride"),
        "source": prov.get("source", prov.get("engine")),
        "distribution": prov.get("distribution"),
        "layer": prov.get("layer_name", prov.get("layer")),
        # vLLM with TP row sharding: this rank's rows of the chunk ({"tp_rank", "start", "end"}), else None
        "row_window": prov.get("row_window"),
        "stored_bytes": info.stored_bytes,
        "provenance": prov,
    }
    if case is None:
        return out
    raw = sum(a.nbytes for a in (getattr(case, name) for name in CASE_ARRAYS) if a is not None)
    lengths = case.lengths
    padded_bytes = case.rows * case.cols * case.values.itemsize
    out.update({
        "valid_bytes": case.nbytes,
        "raw_bytes": raw,
        "compression_ratio": (raw / info.stored_bytes) if info.stored_bytes else None,
        "padded_bytes": padded_bytes,
        "stored_vs_padded": (info.stored_bytes / padded_bytes) if info.stored_bytes and padded_bytes else None,
        "row_length": {"min": int(lengths.min()) if lengths.size else 0,
                       "median": float(np.median(lengths)) if lengths.size else 0.0,
                       "max": int(lengths.max()) if lengths.size else 0,
                       "shorter_than_k": int((lengths < case.top_k).sum()),
                       "nonzero_starts": int((case.row_starts != 0).sum())},
        "values": value_stats(case),
    })
    return out
