"""What the SGLang plugin depends on in each SGLang release it knows: one table, keyed by release.

SGLang moves its internals between patch releases (0.5.x), so a release is known by its exact version
(a `.postN` of it included). Everything the plugin reads is here: where the indexer's top-k entry is
(`DSAIndexerMetadata.topk_transform`) and its parameters, the indexer's methods that call it (which say the
path), the top-k backend's module and the v2 kernel's top-k limit (which name the transform that ran),
and the model runner and capture-mode modules (the steps, CUDA-graph replays and warm-up runs). A release
not in the table is not captured at all: the plugin says so once in the server log and in the run summary
(`engine_unsupported`) and wraps nothing, since a case read with another release's facts could be wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DSA = "sglang.srt.layers.attention.dsa"


@dataclass(frozen=True)
class Release:
    """One SGLang release's facts the plugin depends on."""

    name: str
    metadata_module: str  # defines `metadata_class`, whose `transform` every indexer top-k goes through
    metadata_class: str
    transform: str
    params: tuple[str, ...]  # `transform`'s parameters after self, in order
    backend_module: str  # `DSATopKBackend`, `TopkTransformMethod`, `envs`, `_is_hip`
    v2_max_topk: int  # the fused v2 kernels take 0 < topk <= this
    # `Indexer` methods that call `transform`: paged (decode, target verify, draft extend), ragged
    # (extend), and the K-only path (dummy logits: every key selected, nothing to capture)
    paged_caller: str
    ragged_caller: str
    k_only_caller: str
    runner_module: str  # `ModelRunner.forward` is one step; its output's `can_run_graph` a graph replay
    capture_mode_module: str  # `get_is_capture_mode()`: the runners' warm-up and graph-capture runs
    warmup_functions: frozenset[str]  # the runners' warm-up and dummy runs, by function name


RELEASES: dict[str, Release] = {
    "0.5.23": Release(
        "0.5.23",
        f"{_DSA}.dsa_indexer_metadata", "DSAIndexerMetadata", "topk_transform",
        ("logits", "topk", "ks", "cu_seqlens_q", "ke_offset", "batch_idx_list", "topk_indices_offset_override"),
        f"{_DSA}.dsa_topk_backend", 2048,
        "_get_topk_paged", "_get_topk_ragged", "_forward_cuda_k_only",
        "sglang.srt.model_executor.model_runner", "sglang.srt.model_executor.runner_utils.capture_mode",
        frozenset({"_dummy_run", "_warmup", "warmup", "capture_one_shape", "_run_dummy_forward"}),
    ),
}
LATEST = RELEASES["0.5.23"]


def release(version: str | None) -> Release | None:
    """The known release of an SGLang version string (`0.5.23`, `0.5.23.post1`), or None."""
    if not version:
        return None
    return RELEASES.get(re.sub(r"\.post\d+$", "", version.split("+")[0]))


def unsupported(version: str | None) -> str:
    """The one line that says a version is not captured."""
    return (f"SGLang {version or '(version unknown)'} is not a release the logitreplay capture plugin knows "
            f"({', '.join(RELEASES)}): nothing is captured")


__all__ = ["LATEST", "RELEASES", "Release", "release", "unsupported"]
