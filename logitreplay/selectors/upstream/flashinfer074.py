"""FlashInfer 0.7.4's deterministic mode on SGLang's DSA calls, on the radix path that serves it.

Read from flashinfer-python 0.7.4 (`flashinfer/topk.py`): `deterministic=True` makes the output order
repeatable for a given input and system. CUB has no such mode (`can_use_cub_topk` is false for it) and
the SM100 clusters kernel is never used for it, so the radix FilteredTopK path serves these calls; under
`dsa_graph_safe=True` that path takes k <= 2048, and past it the call raises (`_resolve_graph_safe_backend`).
Everything else is flashinfer.py's call: `flashinfer-ragged-det` is `flashinfer-ragged`, and
`flashinfer-paged-det` is `flashinfer-paged`, with the flag on.
"""

from __future__ import annotations

from logitreplay.selectors.upstream.base import Declared, Release
from logitreplay.selectors.upstream.flashinfer import (
    DTYPES,
    FILTERED_TOPK_MAX_K,
    FLASHINFER,
    FlashInferPaged,
    FlashInferRagged,
)

FLASHINFER_074 = Release(FLASHINFER, "0.7.4", ("0.7.4", "0.7.5"))


class FlashInferRaggedDeterministic(FlashInferRagged):
    declared = Declared("flashinfer-ragged-det", FLASHINFER_074, DTYPES, (1, FILTERED_TOPK_MAX_K),
                        ("decode", "starts", "padded"))
    deterministic = True


class FlashInferPagedDeterministic(FlashInferPaged):
    declared = Declared("flashinfer-paged-det", FLASHINFER_074, DTYPES, (1, FILTERED_TOPK_MAX_K),
                        ("decode", "padded"))
    deterministic = True


__all__ = ["FLASHINFER_074", "FlashInferPagedDeterministic", "FlashInferRaggedDeterministic"]
