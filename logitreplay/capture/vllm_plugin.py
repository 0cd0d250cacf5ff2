"""vLLM serving plugin: capture the logits that vLLM's sparse-attention indexer hands to its prefill top-k.

vLLM loads every `vllm.general_plugins` entry point in each of its processes (API server, engine core,
every worker). `register` does nothing unless `LOGITREPLAY_CAPTURE_DIR` is set; then it wraps
`vllm._custom_ops.top_k_per_row_prefill` and, for builds whose indexer calls the op directly,
`torch.ops._C.top_k_per_row_prefill`. The wrapper first runs the production kernel, then, if the policy
wants the matrix (decided from its layer and width alone), stages a device copy of it for the writer,
without ever reading ks/ke on the host (that would stall the model's thread on its stream), and keeps:

- only each row's `[ks, ke)`: vLLM computes the logits with `clean_logits=False`, so everything outside
  the bounds is uninitialized memory and not data (the writer cuts the rows on the host, and refuses
  bounds outside the matrix there);
- ks/ke, the row stride (DeepGEMM pads rows), the indices the production kernel wrote (before any
  context-parallel merge rewrites them), the layer name (the indexer's `k_cache_prefix`, read from the
  calling frame), the chunk's token range and its number of requests (distinct ks values);
- never while a CUDA graph is being captured (the copy would be baked into the graph), and by default on
  tensor-parallel rank 0 only (the indexer is replicated across TP ranks, so other ranks hold the same data).

Environment:
  LOGITREPLAY_CAPTURE_DIR            archive directory (created or appended to); unset = plugin off
  LOGITREPLAY_CAPTURE_POLICY         policy spec, as `capture hf --policy` (default: first per layer, width)
  LOGITREPLAY_CAPTURE_RANKS          `0` (default), `all`, or TP ranks like `0+1`
  LOGITREPLAY_CAPTURE_PENDING_BYTES  device bytes staged but not yet written before dropping (default 4G)
  LOGITREPLAY_CAPTURE_MODEL          model id (or path) to record; vLLM keeps its config current only while
  LOGITREPLAY_CAPTURE_REVISION       building the model, so at kernel time a worker may not know it
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from logitreplay.capture.hooks import layer_number
from logitreplay.capture.policy import Policy, PolicyState, parse_size
from logitreplay.capture.writer import DEFAULT_MAX_PENDING_BYTES, CaptureWriter

log = logging.getLogger("logitreplay.capture")

ENV_DIR = "LOGITREPLAY_CAPTURE_DIR"
ENV_POLICY = "LOGITREPLAY_CAPTURE_POLICY"
ENV_RANKS = "LOGITREPLAY_CAPTURE_RANKS"
ENV_PENDING = "LOGITREPLAY_CAPTURE_PENDING_BYTES"
ENV_MODEL = "LOGITREPLAY_CAPTURE_MODEL"
ENV_REVISION = "LOGITREPLAY_CAPTURE_REVISION"
OP_NAME = "top_k_per_row_prefill"
_active: VllmCapture | None = None


def register() -> None:
    """The `vllm.general_plugins` entry point. Never raises: a broken capture must not stop a server."""
    directory = os.environ.get(ENV_DIR)
    if not directory or _active is not None:
        return
    try:
        import vllm
        import vllm._custom_ops as ops

        ranks_spec = os.environ.get(ENV_RANKS, "0").strip().lower()
        capture = VllmCapture(
            directory,
            Policy.parse(os.environ.get(ENV_POLICY, "")),
            ranks=None if ranks_spec == "all" else {int(r) for r in ranks_spec.split("+")},
            max_pending_bytes=parse_size(os.environ.get(ENV_PENDING, str(DEFAULT_MAX_PENDING_BYTES))),
            provenance={"engine": "vllm", "engine_version": getattr(vllm, "__version__", None)},
        )
        capture.install(ops, torch.ops._C)
        atexit.register(capture.close)
    except Exception as e:
        log.error("logitreplay capture not enabled: %s: %s", type(e).__name__, e)


class VllmCapture:
    """The wrapper state of one process: policy selection, a lazily created writer, the patched targets."""

    def __init__(self, directory: str | os.PathLike[str], policy: Policy, *, ranks: set[int] | None = None,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 provenance: dict[str, Any] | None = None) -> None:
        self.directory = directory
        self.selection = PolicyState(policy)
        self.ranks = ranks
        self.max_pending_bytes = max_pending_bytes
        self.provenance = dict(provenance or {})
        self.writer: CaptureWriter | None = None
        self.enabled = True
        self.error: str | None = None
        self._rank: tuple[int, int] | None = None  # (tensor-parallel rank, global rank), known at first call
        self._inside = threading.local()
        self._patched: list[tuple[Any, Any]] = []  # (target object, original attribute)

    def install(self, *targets: Any) -> int:
        """Wrap `top_k_per_row_prefill` on each target that has it (a module or a `torch.ops` namespace);
        returns how many were wrapped. Called through both, a call is captured once."""
        global _active
        for target in targets:
            try:
                original = getattr(target, OP_NAME)
            except (AttributeError, RuntimeError):
                continue
            setattr(target, OP_NAME, _Wrapped(self, original))
            self._patched.append((target, original))
        if not self._patched:
            raise RuntimeError(f"no {OP_NAME} found to wrap")
        _active = self
        return len(self._patched)

    def uninstall(self) -> None:
        global _active
        for target, original in reversed(self._patched):
            setattr(target, OP_NAME, original)
        self._patched.clear()
        if _active is self:
            _active = None

    def close(self) -> dict[str, Any] | None:
        """Flush and write the run summary (also registered with atexit in a vLLM process)."""
        return self.writer.close() if self.writer is not None else None

    def _after(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
               indices: torch.Tensor, rows: int, stride0: int, stride1: int, top_k: int) -> None:
        try:
            if self.writer is not None and self.writer.failed:  # it has logged why; stop asking
                self.enabled = False
                return
            if self.selection.exhausted() or _capturing_graph(logits) or not self._rank_wanted():
                return
            layer_name, chunk = _caller_facts(sys._getframe(2))  # _after <- _Wrapped.__call__ <- caller
            number = layer_number(layer_name)
            layer_index = -1 if number is None else number
            cols = int(logits.shape[1])
            if not self.selection.wants(layer_index, cols):
                return
            if stride1 != 1 or logits.stride(1) != 1 or logits.stride(0) != stride0:
                raise RuntimeError(f"logits {tuple(logits.shape)} strides {logits.stride()} do not match "
                                   f"stride0={stride0}, stride1={stride1}")
            if self.writer is None:
                self.writer = CaptureWriter(self.directory, self.selection, rank=self._global_rank(),
                                            max_pending_bytes=self.max_pending_bytes)
            attrs = {
                **self.provenance,
                **_model_facts(),
                "layer_name": layer_name,
                "layer_index": layer_index,
                "index_source": f"input of vLLM {OP_NAME}",
                "reference_source": f"indices written by vLLM {OP_NAME}",
                "tp_rank": self._tp_rank(),
                "chunk": chunk,  # the writer adds the number of requests: distinct ks values
                "device": torch.cuda.get_device_name(logits.device) if logits.is_cuda else str(logits.device),
            }
            self.writer.submit(logits[:rows], row_starts[:rows], row_ends[:rows], indices[:rows, :top_k],
                               top_k=top_k, row_stride=stride0, layer_index=layer_index, layer_name=layer_name,
                               requests=None, attrs=attrs)
        except Exception as e:  # never into the model: log once and stop capturing
            self._fail(f"{type(e).__name__}: {e}")

    def _fail(self, message: str) -> None:
        self.enabled = False
        if self.error is None:
            self.error = message
            log.error("logitreplay capture disabled: %s", message)

    def _rank_wanted(self) -> bool:
        return self.ranks is None or self._tp_rank() in self.ranks

    def _tp_rank(self) -> int:
        return self._ranks()[0]

    def _global_rank(self) -> int:
        return self._ranks()[1]

    def _ranks(self) -> tuple[int, int]:
        if self._rank is None:
            dist = torch.distributed
            global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            try:
                from vllm.distributed import get_tensor_model_parallel_rank

                tp_rank = int(get_tensor_model_parallel_rank())
            except Exception:
                tp_rank = global_rank
            self._rank = (tp_rank, global_rank)
        return self._rank


class _Wrapped:
    """Stands in for the op: runs the original, then offers the call to the capture. Every other attribute
    (`.default`, overloads, the schema) is the original's, so code that inspects the op keeps working."""

    def __init__(self, capture: VllmCapture, original: Callable[..., Any]) -> None:
        self._capture = capture
        self._original = original
        self.__wrapped__ = original

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        capture = self._capture
        if getattr(capture._inside, "active", False):  # the outer wrapper of this same call captures
            return self._original(*args, **kwargs)
        capture._inside.active = True
        try:
            result = self._original(*args, **kwargs)
        finally:
            capture._inside.active = False
        # (logits, row_starts, row_ends, indices, num_rows, stride0, stride1, top_k), as vLLM passes them
        if capture.enabled and len(args) == 8 and not kwargs:
            logits, row_starts, row_ends, indices, num_rows, stride0, stride1, top_k = args
            capture._after(logits, row_starts, row_ends, indices, int(num_rows), int(stride0), int(stride1),
                           int(top_k))
        return result


def _capturing_graph(logits: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured on this stream: a copy made now would be baked into the
    graph and replayed with every later step."""
    return logits.is_cuda and torch.cuda.is_current_stream_capturing()


def _caller_facts(frame: FrameType | None, depth: int = 6) -> tuple[str, dict[str, Any]]:
    """The layer name and chunk facts from vLLM's indexer function that called the op (a few frames up):
    its `k_cache_prefix` local names the layer's indexer cache, its `chunk` local the prefill chunk."""
    for _ in range(depth):
        if frame is None:
            break
        local = frame.f_locals
        if "k_cache_prefix" in local:
            chunk = local.get("chunk")
            facts = {k: int(v) for k in ("token_start", "token_end")
                     if isinstance(v := getattr(chunk, k, None), int)}
            return str(local["k_cache_prefix"]), facts
        frame = frame.f_back
    return "unknown", {}


@functools.cache
def _model_facts() -> dict[str, Any]:
    """Model id and exact revision (the hub-cache snapshot sha): from LOGITREPLAY_CAPTURE_MODEL /
    LOGITREPLAY_CAPTURE_REVISION, else from the engine's config when it is current in this process."""
    model, revision = os.environ.get(ENV_MODEL), os.environ.get(ENV_REVISION)
    if model is None:
        try:
            from vllm.config import get_current_vllm_config_or_none

            config = get_current_vllm_config_or_none()
            model_config = getattr(config, "model_config", None)
            if model_config is not None:
                model, revision = str(model_config.model), revision or getattr(model_config, "revision", None)
        except Exception:
            pass
    if model is None:
        return {}
    from logitreplay.capture.hf import model_provenance

    return model_provenance(model, revision, None)


__all__ = ["ENV_DIR", "ENV_MODEL", "ENV_PENDING", "ENV_POLICY", "ENV_RANKS", "ENV_REVISION", "VllmCapture",
           "register"]
