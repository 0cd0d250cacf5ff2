"""vLLM serving plugin: capture the logits that vLLM's sparse-attention indexer (0.33, 0.34) hands its top-k.

vLLM loads every `vllm.general_plugins` entry point in each of its processes (API server, engine core,
every worker). `register` does nothing unless `LOGITREPLAY_CAPTURE_DIR` is set; then it wraps the call
sites in `SITES`. Each wrapper first runs the production function, then, if the policy wants the call
(decided from its layer and width alone), stages device copies for the writer without ever reading
device data on the host (that would stall the model's thread on its stream). The sites:

- `top_k_per_row_prefill` on `vllm._custom_ops` (looked up at call time by `sparse_attn_indexer`) and on
  `torch.ops._C` (for builds that call the op directly): the prefill top-k of DeepSeek V3.2/V4/V4.1
  over fp32 compressed logits (row i holds its own keys from column 0; the tail past `rowEnds` is
  uninitialized memory, never data);
- `deep_select_topk` on `vllm.model_executor.layers.indexer_topk` and on the modules that import it by
  name (0.34's `sparse_attn_indexer.py`; `kernels/attention/dsa/sparse_mqa_logits.py`,
  `candidate_blocks.py`): 0.34's prefill top-k over bf16 logits with the `deep_select` backend, DeepSeek
  V4.1's top-k over bf16 sparse logits (`attention_config.indexer_sparse_logits`) and the candidate
  source's block selection. Patched before those modules are imported, the name they bind is the wrapper;
- `fused_mqa_topk_prefill` (0.34), only counted: it builds no logits (`calls_by_path.fused`);
- `SparseIndexerTopk.forward` (`indexer_topk.py`): the decode top-k of every backend (cooperative,
  persistent, per_row, deep_select, ...), called by `sparse_attn_indexer`'s decode branch as
  `get_indexer_topk(backend)(logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len)`; and
  `top_k_per_row_decode` on `vllm._custom_ops` and `torch.ops._C` for builds that call the op directly
  (inside `forward` it is the inner call and not captured twice). A decode case records the call's facts
  (`kind: decode`, `archive/decode.py`): next_n, seq_lens (the row ends are derived on the device by
  vLLM's `_row_ends` rule, read on the writer thread), max_seq_len, max_model_len, the backend `forward`
  resolved, speculative (next_n > 1).

Decode and CUDA graphs: vLLM runs decode steps in CUDA graphs. Under `CUDAGraphMode.FULL` the indexer is
inside the graph, so its Python never runs on a replay and those steps are not captured; decode steps
are captured when they run eagerly: batches larger than the largest captured size, `enforce_eager`, or
piecewise graphs, where `sparse_attn_indexer` (`@eager_break_during_capture`) re-runs in Python on each
replay. Nothing is staged while a graph is being captured (the copies would be baked into it and replay
on every later step), nor in vLLM's dummy runs (`_dummy_run`, `profile_run`, `capture_model`, V2's
`warmup_kernels`: logits of an uninitialized cache). Decode calls are keyed by (layer, batch bucket,
width bucket) (`policy.shape_key`; every decode matrix is max_model_len wide): the default keeps each
layer's first real decode call of every power-of-two batch size.

The chunk's layout, its rows, the TP split of the rows and the calling layer come from the indexer op's
arguments, the top-k's output view and the forward context's indexer metadata (`vllm_frames`); what
differs between releases is `vllm_versions`' table, and a release not in it is not captured. A case is
never staged while a CUDA graph is being captured (the copy would be baked
into the graph). Ranks: by default tensor-parallel rank 0 captures replicated rows (every rank holds the
same), and every rank captures its own row window when vLLM shards prefill rows across TP ranks.

Extension point: a new intercepted call is one more `Site` in `vllm_sites.SITES`: the attribute to wrap,
where to find it, and a `read` function that turns a call's arguments and calling frame into a `Call`
(or None: not one to capture). Wrapping, the rank and policy decisions, staging and the writer are shared
with the SGLang plugin (`serving.EngineCapture`).

Every intercepted call is also counted, stored or not, refused by the policy or the ranks alike (layer,
width = matrix.shape[1], rows = matrix.shape[0], dtype, prefill/decode: host metadata, no sync), per
engine step: `steps` wraps the model runner's `execute_model` and times it; `close` writes the
process's record (`archive/calls.py`) for `replay --per-forward`. The same rules as for staging apply
(not under graph capture, not in dummy runs, once per call). Counting needs each call's layer, so the
site's `read` now runs for every call, also after the policy is exhausted. A process whose ranks store
nothing (the other TP ranks of replicated rows, which see rank 0's calls) writes no record.

The settings (`LOGITREPLAY_CAPTURE_*`) and the flush on every way a process ends are `serving`'s.
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from logitreplay.capture import serving
from logitreplay.capture.serving import ENV_DIR, EngineCapture, recorded_model
from logitreplay.capture.sites import Site
from logitreplay.capture.steps import Runner, Steps
from logitreplay.capture.vllm_sites import SITES
from logitreplay.capture.vllm_versions import RELEASES, Release, release, unsupported

log = logging.getLogger("logitreplay.capture")

# vLLM's runs on dummy inputs (V1 and V2 model runners): their logits score an uninitialized cache.
_WARMUP_FUNCTIONS = frozenset({"_dummy_run", "profile_run", "capture_model", "warmup_kernels"})


def register() -> None:
    """The `vllm.general_plugins` entry point. Never raises: a broken capture must not stop a server."""
    directory = os.environ.get(ENV_DIR)
    if not directory or serving._active is not None:
        return
    try:
        version = _version()
        capture = VllmCapture.from_env(directory, "vllm", version)
        assert isinstance(capture, VllmCapture)
        capture.release = release(version)
        if capture.release is None:
            capture.refuse(unsupported(version))
        else:
            capture.install()
    except Exception as e:
        log.error("logitreplay capture not enabled: %s: %s", type(e).__name__, e)


def _version() -> str | None:
    import vllm

    found = getattr(vllm, "__version__", None)
    if found is None:
        from importlib.metadata import version

        found = version("vllm")
    return str(found)


def _runner(modules: tuple[str, ...]) -> Runner:
    """vLLM's step: `GPUModelRunner.execute_model` in each of the release's runner modules, whose
    `dummy_run=True` (V2) is not a step."""
    return Runner("vllm", modules, "GPUModelRunner", "execute_model", lambda args, kwargs: bool(kwargs.get("dummy_run")))


RUNNER = _runner(RELEASES["0.33"].runner_modules)


class VllmCapture(EngineCapture):
    """The shared capture with vLLM's sites, step, dummy runs, tensor-parallel group and model facts;
    `release` (`vllm_versions`) is what differs between the vLLM releases it knows."""

    sites: tuple[Site, ...] = SITES
    runner: Runner = RUNNER
    warmup_functions: frozenset[str] = _WARMUP_FUNCTIONS
    steps_only = True
    release: Release | None = RELEASES["0.33"]

    def install(self, sites: tuple[Site, ...] | None = None) -> int:
        """Wrap the sites, and the release's model runners for the steps."""
        if self.release is not None and self.steps.runner.modules != self.release.runner_modules:
            self.steps.uninstall()
            self.steps = Steps(_runner(self.release.runner_modules))
        return super().install(sites)

    def model_facts(self) -> dict[str, Any]:
        return _model_facts()

    def tensor_parallel(self) -> tuple[int, int] | None:
        try:
            from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

            return int(get_tensor_model_parallel_rank()), int(get_tensor_model_parallel_world_size())
        except Exception:
            return None


@functools.cache
def _model_facts() -> dict[str, Any]:
    """Model id and exact revision (the hub-cache snapshot sha) for vLLM: see `recorded_model`."""
    return recorded_model(_vllm_model)


def _vllm_model() -> tuple[str, str | None] | None:
    """The model of the vLLM config current in this process, if one is."""
    from vllm.config import get_current_vllm_config_or_none

    model_config = getattr(get_current_vllm_config_or_none(), "model_config", None)
    return None if model_config is None else (str(model_config.model), getattr(model_config, "revision", None))


__all__ = ["RUNNER", "VllmCapture", "register"]
