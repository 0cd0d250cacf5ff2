"""SGLang serving plugin: capture the logits that SGLang's DSA indexer hands to its top-k (the releases it
knows and what it reads in each: `sglang_versions`; 0.5.23, the current release).

SGLang runs the callables of the `sglang.srt.plugins` entry point group in every process it starts
(`sglang.srt.plugins.load_plugins`: the engine, the data-parallel controller, the detokenizer, and each
scheduler process, which is one tensor-parallel worker: it owns a GPU and runs the model). `register` does
nothing unless `LOGITREPLAY_CAPTURE_DIR` is set, exactly as the vLLM plugin; then it wraps
`DSAIndexerMetadata.topk_transform` (`sglang_sites`), the call the indexer's paged (decode) and ragged
(prefill) paths make. If `SGLANG_PLUGINS` restricts the plugins a process loads, it must name
`logitreplay_capture`.

Everything else is shared with the vLLM plugin (`serving.EngineCapture`): the policy (one case per policy
key: (layer, width) for prefill, (layer, rows bucket, width bucket) for decode), the settings
(`LOGITREPLAY_CAPTURE_POLICY`, `_RANKS`, `_PENDING_BYTES`, `_EXIT_WAIT`, `_MODEL`, `_REVISION`), the
writer (device-to-device copies on the model's stream, a bounded queue, a side stream to the host, no host
sync on the model's thread), the flush on every way a process ends (spawned scheduler processes run
atexit; forked ones multiprocessing's finalizers; a SIGKILLed one leaves every completed case), and the
per-forward call record, whose step is `ModelRunner.forward` (`sglang/srt/model_executor/model_runner.py`).

What SGLang adds:
- Decode and CUDA graphs. SGLang captures decode batches in CUDA graphs by default: a step the decode
  graph runner replays (`ModelRunnerOutput.can_run_graph`) runs no Python in the layers, so its indexer
  calls are neither captured nor counted; the run summary counts those steps (`cuda_graph.replayed_steps`).
  Decode is captured where it runs eagerly: `--cuda-graph-backend-decode=disabled`, or batches larger
  than `--cuda-graph-max-bs-decode`. Nothing is staged while a graph is captured, nor in the runners'
  warm-up and dummy runs (SGLang's capture mode, `get_is_capture_mode()`, and the release's
  `warmup_functions`).
  Piecewise prefill graphs run the indexer as a split op, eagerly, so prefill is captured there too.
- Ranks. Attention tensor-parallel ranks of one data-parallel group score the same rows; with DP attention
  (`--attn-dp-size N`) each group scores its own requests. `auto` (the default) captures on each
  group's attention-TP rank 0, i.e. on TP rank 0 alone without DP attention; `all` and `0+1` name TP ranks
  as for vLLM. Each case records `tp_rank`, `tp_size`, `attn_tp_rank`, `attn_dp_rank`, `attn_dp_size`, and
  the row window of a chunked prefill call (`row_window`, rows [start, end) of the forward).
- The layer. SGLang's `Indexer` keeps its `layer_id` and no name: the name is its module path in the model
  (`model.layers.N.self_attn.indexer`), looked up once per model.
- Never silent. Every `topk_transform` call is counted in the run summary's `calls_by_path` by its path
  (`decode`, `target_verify`, `draft_extend`, `extend`; `k_only`, SGLang's path for batches whose longest
  sequence is at most index_topk, which runs the top-k on dummy zeros and so holds no logits; `other`, a
  caller the plugin does not read) and outcome: captured, skipped (policy, budgets, ranks), warm-up, not
  capturable (with why). A release not in `sglang_versions` wraps nothing and says so, once in the server
  log and in the run summary (`engine_unsupported`).
- The fused transform. What `topk_transform` returns is page-table slots or offset positions; the case
  records the call SGLang made, its page table or offsets (`attrs["transform"]`), and the reference
  indices mapped back to row-local ones.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

import torch

from logitreplay.capture import serving, sglang_sites
from logitreplay.capture.serving import AUTO, ENV_DIR, EngineCapture, recorded_model
from logitreplay.capture.sglang_versions import LATEST, Release, release, unsupported
from logitreplay.capture.sites import Call, Site
from logitreplay.capture.steps import Runner, Steps

log = logging.getLogger("logitreplay.capture")


def register() -> None:
    """The `sglang.srt.plugins` entry point. Never raises: a broken capture must not stop a server. A
    release the plugin does not know (`sglang_versions`) is refused: one line in the log and the summary."""
    directory = os.environ.get(ENV_DIR)
    if not directory or serving._active is not None:
        return
    try:
        import sglang

        version = getattr(sglang, "__version__", None)
        capture = SglangCapture.from_env(directory, "sglang", version)
        assert isinstance(capture, SglangCapture)
        capture.release = release(version)
        if capture.release is None:
            capture.refuse(unsupported(version))
        else:
            capture.install()
    except Exception as e:
        log.error("logitreplay capture not enabled: %s: %s", type(e).__name__, e)


def _capture_mode(module_name: str) -> bool:
    """SGLang's capture mode: on while a runner warms up and captures its graphs (eager runs included)."""
    module = sys.modules.get(module_name)  # not imported yet: no runner has captured anything
    try:
        return module is not None and bool(module.get_is_capture_mode())
    except Exception:
        return False


def _runner(r: Release) -> Runner:
    """SGLang's step: `ModelRunner.forward`; a run in capture mode is a dummy run, an output with
    `can_run_graph` a replayed decode graph."""
    return Runner("sglang", (r.runner_module,), "ModelRunner", "forward",
                  lambda args, kwargs: _capture_mode(r.capture_mode_module),
                  lambda result: bool(getattr(result, "can_run_graph", False)))


class SglangCapture(EngineCapture):
    """The shared capture with SGLang's site, step, warm-up runs, ranks and model facts, all from the
    release (`sglang_versions`)."""

    release: Release | None = LATEST
    runner = _runner(LATEST)
    warmup_functions = LATEST.warmup_functions

    def install(self, sites: tuple[Site, ...] | None = None) -> int:
        if self.release is None:
            raise RuntimeError("no SGLang release to capture from (refuse() says why)")
        self.sites = (sglang_sites.site(self.release),)
        self.warmup_functions = self.release.warmup_functions
        if self.steps.runner.modules != (self.release.runner_module,):
            self.steps = Steps(_runner(self.release))
        return super().install(sites)

    def in_warmup(self, frame: Any) -> bool:
        return _capture_mode((self.release or LATEST).capture_mode_module) or super().in_warmup(frame)

    def model_facts(self) -> dict[str, Any]:
        return _model_facts()

    def close(self, timeout: float | None = None) -> dict[str, Any] | None:
        if self.writer is not None and self._pid == os.getpid():
            self.writer.note("cuda_graph", {
                "replayed_steps": self.steps.graph_steps,
                "note": "steps replayed from SGLang's decode CUDA graphs run no Python in the layers: their "
                        "indexer calls are not captured nor counted (--cuda-graph-backend-decode=disabled, or "
                        "batches above --cuda-graph-max-bs-decode, run decode eagerly)"})
        return super().close(timeout)

    def _rank_wanted(self, sharded: bool) -> bool:
        if self.ranks == AUTO:
            return self._attention()["attn_tp_rank"] == 0
        return super()._rank_wanted(sharded)

    def _tp_attrs(self, call: Call) -> dict[str, Any]:
        return {**super()._tp_attrs(call), **self._attention()}

    def _ranks(self) -> tuple[int, int, int | None]:
        if self._rank is None:
            dist = torch.distributed
            global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            parallel = _parallel()
            tp_rank = _field(parallel, "tp_rank")
            self._rank = (global_rank if tp_rank is None else tp_rank, global_rank, _field(parallel, "tp_size"))
        return self._rank

    def _attention(self) -> dict[str, Any]:
        """This process's place in the attention split: (attention TP rank, DP rank, DP size); without DP
        attention the TP rank, 0, 1."""
        parallel = _parallel()
        tp_rank = _field(parallel, "attn_tp_rank")
        dp_rank, dp_size = _field(parallel, "attn_dp_rank"), _field(parallel, "attn_dp_size")
        return {"attn_tp_rank": self._ranks()[0] if tp_rank is None else tp_rank,
                "attn_tp_size": _field(parallel, "attn_tp_size"),
                "attn_dp_rank": 0 if dp_rank is None else dp_rank, "attn_dp_size": 1 if dp_size is None else dp_size}


def _parallel() -> Any:
    try:
        from sglang.srt.runtime_context import get_parallel

        return get_parallel()
    except Exception:
        return None


def _field(parallel: Any, name: str) -> int | None:
    """One published rank or width (SGLang raises for one not written in this process yet)."""
    try:
        value = getattr(parallel, name)
    except Exception:
        return None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


@functools.cache
def _model_facts() -> dict[str, Any]:
    """Model id and revision: LOGITREPLAY_CAPTURE_MODEL / _REVISION, else the server's `--model-path` and
    `--revision` (`recorded_model`)."""
    return recorded_model(_server_model)


def _server_model() -> tuple[str, str | None]:
    from sglang.srt.runtime_context import get_server_args

    args = get_server_args()
    return str(args.model_path), getattr(args, "revision", None)


__all__ = ["SglangCapture", "register"]
