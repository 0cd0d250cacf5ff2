"""What differs between the vLLM releases the plugin knows: one table, keyed by release (major.minor).

Everything else the plugin reads is the same in every release it knows: the top-k call boundary
(`top_k_per_row_prefill`'s op arguments, `deep_select_topk(logits, k, end=, output_idx=)`,
`SparseIndexerTopk.forward`), the `sparse_attn_indexer` op's own arguments (`k_cache_prefix`,
`topk_indices_buffer`, the candidate arguments), and the forward context's indexer metadata
(`attn_metadata[k_cache_prefix].prefill.chunks`, each with `token_start`/`token_end`, `cu_seqlen_ks`,
`num_reqs`, `max_seqlen_k`). A release not in the table is not captured at all: its layout of rows may
differ in ways a case would record wrongly, so the plugin says so (one log line, the run summary) and
wraps nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    """One vLLM release line's facts the plugin depends on."""

    name: str
    # Model runner modules, each with `GPUModelRunner.execute_model` (one call = one step).
    runner_modules: tuple[str, ...]
    # Modules that bind `deep_select_topk` by name (besides `indexer_topk`, which defines it).
    deep_select_binders: tuple[str, ...]
    # How TP ranks split prefill rows: "row_shard" (contiguous windows sized by the prefill metadata's
    # `row_shard_sizes`; rows keep their step positions) or "shardq" (the metadata's
    # `shardq_gather_indices`: each rank's rows, gathered compactly, with their step positions).
    tp_rows: str
    # `sparse_attn_indexer`'s fused MQA-logits top-k (`fused_mqa_topk_prefill`), which builds no logits.
    fused_topk: str | None


_DSA_KERNELS = "vllm.model_executor.kernels.attention.dsa"
RELEASES: dict[str, Release] = {
    "0.33": Release(
        "0.33",
        ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"),
        (f"{_DSA_KERNELS}.sparse_mqa_logits", f"{_DSA_KERNELS}.candidate_blocks"),
        "row_shard",
        None,
    ),
    "0.34": Release(
        "0.34",
        ("vllm.v1.worker.gpu.model_runner",),
        (f"{_DSA_KERNELS}.sparse_mqa_logits", f"{_DSA_KERNELS}.candidate_blocks",
         "vllm.model_executor.layers.sparse_attn_indexer"),
        "shardq",
        "fused_mqa_topk_prefill",
    ),
}
FUSED_OFF = "VLLM_USE_FUSED_MQA_TOPK=0"  # the engine's switch back to the logits path


def release(version: str | None) -> Release | None:
    """The known release line of a vLLM version string (`0.34.0`, `0.34.1.dev3+g...`), or None."""
    if not version:
        return None
    parts = version.split(".")
    return RELEASES.get(".".join(parts[:2])) if len(parts) >= 2 else None


def unsupported(version: str | None) -> str:
    """The one line that says a version is not captured."""
    known = ", ".join(RELEASES)
    return (f"vLLM {version or '(version unknown)'} is not a release the logitreplay capture plugin knows "
            f"({known}): nothing is captured")


__all__ = ["FUSED_OFF", "RELEASES", "Release", "release", "unsupported"]
