"""SGLang serving plugin: capture the logits that SGLang 0.5.23's DSA indexer hands to its top-k.

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
  warm-up and dummy runs (SGLang's capture mode, `get_is_capture_mode()`, and the functions in `_WARMUP_FUNCTIONS`).
  Piecewise prefill graphs run the indexer as a split op, eagerly, so prefill is captured there too.
- Ranks. Attention tensor-parallel ranks of one data-parallel group score the same rows; with DP attention
  (`--attn-dp-size N`) each group scores its own requests. `auto` (the default) captures on each
  group's attention-TP rank 0, i.e. on TP rank 0 alone without DP attention; `all` and `0+1` name TP ranks
  as for vLLM. Each case records `tp_rank`, `tp_size`, `attn_tp_rank`, `attn_dp_rank`, `attn_dp_size`, and
  the row window of a chunked prefill call (`row_window`, rows [start, end) of the forward).
- The layer. SGLang's `Indexer` keeps its `layer_id` and no name: the name is its module path in the model
  (`model.layers.N.self_attn.indexer`), looked up once per model.
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

from logitreplay.capture import serving
from logitreplay.capture.serving import AUTO, ENV_DIR, EngineCapture, recorded_model
from logitreplay.capture.sglang_sites import SITE
from logitreplay.capture.sites import Call
from logitreplay.capture.steps import Runner

log = logging.getLogger("logitreplay.capture")

MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
CAPTURE_MODE = "sglang.srt.model_executor.runner_utils.capture_mode"
# The runners' warm-up and graph-capture runs (base_runner, decode/prefill CUDA-graph runners).
_WARMUP_FUNCTIONS = frozenset({"_dummy_run", "_warmup", "warmup", "capture_one_shape", "_run_dummy_forward"})


def register() -> None:
    """The `sglang.srt.plugins` entry point. Never raises: a broken capture must not stop a server."""
    directory = os.environ.get(ENV_DIR)
    if not directory or serving._active is not None:
        return
    try:
        import sglang

        SglangCapture.from_env(directory, "sglang", getattr(sglang, "__version__", None)).install()
    except Exception as e:
        log.error("logitreplay capture not enabled: %s: %s", type(e).__name__, e)


def _capture_mode() -> bool:
    """SGLang's capture mode: on while a runner warms up and captures its graphs (eager runs included)."""
    module = sys.modules.get(CAPTURE_MODE)  # not imported yet: no runner has captured anything
    try:
        return module is not None and bool(module.get_is_capture_mode())
    except Exception:
        return False


SGLANG = Runner("sglang", (MODEL_RUNNER,), "ModelRunner", "forward", lambda args, kwargs: _capture_mode(),
                lambda result: bool(getattr(result, "can_run_graph", False)))


class SglangCapture(EngineCapture):
    """The shared capture with SGLang's site, step, warm-up runs, ranks and model facts."""

    sites = (SITE,)
    runner = SGLANG
    warmup_functions = _WARMUP_FUNCTIONS

    def in_warmup(self, frame: Any) -> bool:
        return _capture_mode() or super().in_warmup(frame)

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


__all__ = ["SGLANG", "SglangCapture", "register"]
