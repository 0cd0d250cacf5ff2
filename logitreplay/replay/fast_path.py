"""vLLM's rule for its DeepSelect prefill fast path, so a report can say which cases production would
send there (the bundled `deepselect` is only a stand-in for production on those cases)."""

from __future__ import annotations

from logitreplay.archive import ELEMENT_BYTES, Case

# vLLM routes a prefill chunk to DeepSelect only when its rows can be read as DeepSelect expects.
_DEEPSELECT_MAX_K = 4096
_DEEPSELECT_ROW_ALIGN = 1024


def fast_path(case: Case) -> tuple[bool, str]:
    """Would vLLM send this case to DeepSelect's prefill fast path (one request, rows starting at column
    0, 1024-byte aligned rows, top_k <= 4096)? Returns (eligible, why not)."""
    if case.top_k > _DEEPSELECT_MAX_K:
        return False, f"top_k {case.top_k} > {_DEEPSELECT_MAX_K}"
    if case.rows and bool((case.row_starts != 0).any()):
        return False, "rows start past column 0"
    chunk = case.attrs.get("chunk")
    if isinstance(chunk, dict) and int(chunk.get("requests", 1)) > 1:
        return False, f"{chunk['requests']} requests"
    if (case.row_stride * ELEMENT_BYTES[case.dtype]) % _DEEPSELECT_ROW_ALIGN:
        return False, f"row stride not {_DEEPSELECT_ROW_ALIGN}-byte aligned"
    return True, ""
