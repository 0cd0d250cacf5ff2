"""What the serving plugins (vLLM, SGLang) share: wrapping the engine's call sites, the rank and policy
decisions, staging for the writer, the per-step call record, and flushing on every way a process ends.

An engine's plugin subclasses `EngineCapture` with its `sites` (`sites.Site`: what to wrap, how to read a
call), its step (`steps.Runner`), the names of its dummy runs, its ranks and its model facts. Each
wrapper first runs the production function, then `offer`s the call: it is read (host metadata only),
counted for the call record, and, if the ranks and the policy want it (decided from its layer and width
alone), staged as device copies for the writer without ever reading device data on the host (that would
stall the model's thread on its stream). Nothing is staged while a CUDA graph is being captured (the copy
would be baked into the graph), nor in the engine's dummy runs.

Every way a process ends flushes the writer, with a bounded wait: forked workers end in `os._exit` after
multiprocessing's exit function, which runs `multiprocessing.util.Finalize` callbacks (atexit does not
run there); spawned and main processes run atexit. A process killed with SIGKILL leaves every completed
case readable and its last run summary.

The settings, read by `from_env` (both engines):
  LOGITREPLAY_CAPTURE_DIR            archive directory (created or appended to); unset = plugin off
  LOGITREPLAY_CAPTURE_POLICY         policy spec, as `capture hf --policy` (default: first per layer, width)
  LOGITREPLAY_CAPTURE_RANKS          `auto` (default), `all`, or TP ranks like `0+1`
  LOGITREPLAY_CAPTURE_PENDING_BYTES  device bytes staged but not yet written before dropping (default 4G)
  LOGITREPLAY_CAPTURE_EXIT_WAIT      seconds an exiting process waits for its staged cases (default 60)
  LOGITREPLAY_CAPTURE_MODEL          model id (or path) to record; vLLM keeps its config current only while
  LOGITREPLAY_CAPTURE_REVISION       building the model, so at kernel time a worker may not know it
"""

from __future__ import annotations

import atexit
import functools
import logging
import multiprocessing.util
import os
import sys
import threading
import types
from collections import Counter
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from logitreplay.archive.calls import write_calls
from logitreplay.capture.policy import Policy, PolicyState, decode_rows, parse_size
from logitreplay.capture.sites import Call, Site
from logitreplay.capture.steps import Runner, Steps
from logitreplay.capture.writer import DEFAULT_MAX_PENDING_BYTES, CaptureWriter

log = logging.getLogger("logitreplay.capture")

ENV_DIR = "LOGITREPLAY_CAPTURE_DIR"
ENV_POLICY = "LOGITREPLAY_CAPTURE_POLICY"
ENV_RANKS = "LOGITREPLAY_CAPTURE_RANKS"
ENV_PENDING = "LOGITREPLAY_CAPTURE_PENDING_BYTES"
ENV_EXIT_WAIT = "LOGITREPLAY_CAPTURE_EXIT_WAIT"
ENV_MODEL = "LOGITREPLAY_CAPTURE_MODEL"
ENV_REVISION = "LOGITREPLAY_CAPTURE_REVISION"
AUTO = "auto"
# What happened to a top-k call the plugin saw (`EngineCapture.calls_by_path`).
CAPTURED, SKIPPED, WARMUP, NOT_CAPTURABLE = "captured", "skipped", "warmup", "not_capturable"
_WARMUP_DEPTH = 400
_active: EngineCapture | None = None  # the capture installed in this process, of whichever engine


class EngineCapture:
    """The wrapper state of one process: policy selection, a lazily created writer, the patched targets.

    An engine is its sites, its step (`runner`), the names of its dummy runs, its ranks and its model
    facts: each plugin's subclass (`vllm_plugin.VllmCapture`, `sglang_plugin.SglangCapture`) sets or
    overrides those and shares the rest."""

    sites: tuple[Site, ...] = ()
    runner: Runner
    warmup_functions: frozenset[str] = frozenset()
    steps_only = False  # whether every call outside the engine's (wrapped) step is a warm-up

    def __init__(self, directory: str | os.PathLike[str], policy: Policy, *,
                 ranks: set[int] | str | None = AUTO, max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 exit_wait_s: float = 60.0, provenance: dict[str, Any] | None = None) -> None:
        self.directory = directory
        self.policy = policy
        self.selection = PolicyState(policy)
        self.ranks = ranks  # AUTO, None (all), or a set of TP ranks
        self.max_pending_bytes = max_pending_bytes
        self.exit_wait_s = exit_wait_s
        self.provenance = dict(provenance or {})
        self.writer: CaptureWriter | None = None
        self.enabled = True
        self.error: str | None = None
        self._pid = os.getpid()
        self._rank: tuple[int, int, int | None] | None = None  # (TP rank, global rank, TP size)
        self._sharded_cases = 0
        self._inside = threading.local()
        self._patched: list[tuple[Any, str, Any]] = []  # (target, attribute, original)
        self.steps = Steps(self.runner)
        self._recorded = False
        self.paths: Counter[tuple[str, str]] = Counter()  # (path, outcome) -> calls
        self.reasons: dict[str, str] = {}  # path -> why its calls are not capturable
        self.unsupported: str | None = None  # the engine release is not one the plugin knows: why

    @classmethod
    def from_env(cls, directory: str, engine: str, version: str | None) -> EngineCapture:
        """The capture the `LOGITREPLAY_CAPTURE_*` settings describe (raises on a malformed one)."""
        spec = os.environ.get(ENV_RANKS, AUTO).strip().lower()
        return cls(
            directory,
            Policy.parse(os.environ.get(ENV_POLICY, "")),
            ranks=spec if spec == AUTO else None if spec == "all" else {int(r) for r in spec.split("+")},
            max_pending_bytes=parse_size(os.environ.get(ENV_PENDING, str(DEFAULT_MAX_PENDING_BYTES))),
            exit_wait_s=float(os.environ.get(ENV_EXIT_WAIT, "60")),
            provenance={"engine": engine, "engine_version": version},
        )

    def install(self, sites: tuple[Site, ...] | None = None) -> int:
        """Wrap each site's attribute on each of its targets that has it; returns how many were wrapped.
        A call seen through two wrappers (the module function and the op it forwards to) is captured once."""
        global _active
        _active = self  # the sites' targets may depend on what this capture knows (the engine's release)
        for site in self.sites if sites is None else sites:
            for target in site.targets():
                try:
                    original = getattr(target, site.name)
                except (AttributeError, RuntimeError):
                    continue
                if isinstance(original, _Wrapped):
                    continue
                setattr(target, site.name, _Wrapped(self, original, site))
                self._patched.append((target, site.name, original))
        if not self._patched:
            _active = None
            raise RuntimeError(f"none of {', '.join(s.name for s in self.sites)} found to wrap")
        self.steps.install()  # the model runner's module is usually imported later: `offer` retries
        _active = self
        return len(self._patched)

    def refuse(self, reason: str) -> None:
        """An engine release the plugin does not know: wrap nothing, say so once in the log and, at exit, in
        the run summary (`engine_unsupported`), so that a run that captured nothing says why."""
        global _active
        self.unsupported = reason
        log.error("logitreplay capture: %s", reason)
        flush = functools.partial(self.close, self.exit_wait_s)
        multiprocessing.util.Finalize(None, flush, exitpriority=10)
        atexit.register(flush)
        _active = self

    def uninstall(self) -> None:
        """Restore the originals, also in modules that imported a wrapper by name after `install`."""
        global _active
        for target, name, original in reversed(self._patched):
            setattr(target, name, original)
        self._patched.clear()
        for site in self.sites:
            for target in site.targets():
                wrapper = getattr(target, site.name, None)
                if isinstance(wrapper, _Wrapped) and wrapper._capture is self:
                    setattr(target, site.name, wrapper.__wrapped__)
        self.steps.uninstall()
        if _active is self:
            _active = None

    def close(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Flush (waiting at most `timeout` s, default unbounded), write this process's run summary and its
        call record (`steps`). Registered at this process's exit when its writer starts."""
        if self._pid != os.getpid():
            return None
        if (self.writer is None and (self.steps.counted or self.paths or self.unsupported) and self.enabled
                and self._rank_wanted(False)):
            self._writer()  # nothing stored, yet the calls were seen: their record needs a writer id
        if self.writer is None:
            return None
        self.writer.note("calls_by_path", self.calls_by_path())
        if self.unsupported is not None:
            self.writer.note("engine_unsupported", self.unsupported)
        summary = self.writer.close(timeout)
        if self._recorded:
            return summary
        self._recorded = True
        try:
            record = self.steps.record(self.writer.prefix)
            if record.forwards:
                write_calls(self.writer.archive, record)
            summary.update(forwards=len(record.forwards), calls=sum(f.n_calls for f in record.forwards))
        except Exception as e:  # the cases are written; a lost call record must not hide them
            self._fail(f"writing the call record: {type(e).__name__}: {e}")
            summary["error"] = summary.get("error") or self.error
        return summary

    def offer(self, site: Site, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any,
              frame: FrameType | None) -> None:
        """One production call, after it ran: stage it for the writer if the ranks and the policy want it.
        Never raises (an error is logged once and turns capture off)."""
        try:
            if self._pid != os.getpid():
                self._forked()
            if self.writer is not None and self.writer.failed:  # it has logged why; stop asking
                self.enabled = False
                return
            tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)  # a method's args[0] is self
            if _capturing_graph(tensor):
                return
            if not self.steps.complete:
                self.steps.install()
            path, uncapturable = site.classify(frame)
            if self.steps.in_dummy_step or (not self.steps.in_step and self._warmup(frame)):
                self._count(path, WARMUP)  # a real step's calls are no dummy run's: no walk up the stack
                return
            if uncapturable is not None:
                self._count(path, NOT_CAPTURABLE, uncapturable)
                return
            call = site.read(args, kwargs, result, frame)
            if call is None:
                self._count(path, NOT_CAPTURABLE, "a caller or arguments this plugin does not read")
                return
            rows, width = (int(n) for n in call.matrix.shape)
            self.steps.count(call.layer.index, width, rows, str(call.matrix.dtype).removeprefix("torch."),
                             str(call.attrs.get("kind", "prefill")))
            if self.selection.exhausted() or not self._rank_wanted(call.shard is not None):
                self._count(path, SKIPPED)
                return
            if not self.selection.wants(call.layer.index, width, decode_rows(call.attrs.get("kind"), rows)):
                self._count(path, SKIPPED)
                return
            writer = self._writer()
            attrs = {**self.provenance, **self.model_facts(), **call.attrs, "index_source": site.source,
                     "tensor_parallel": self._tp_attrs(call), "device": _device_name(call.matrix.device)}
            if call.row_window is not None:
                attrs["row_window"] = {"tp_rank": self._ranks()[0], "start": call.row_window[0],
                                       "end": call.row_window[1]}
            staged = writer.submit(call.matrix, call.starts, call.ends, call.reference, top_k=call.top_k,
                                   row_stride=call.row_stride, layer_index=call.layer.index,
                                   layer_name=call.layer.name, requests=call.requests, attrs=attrs,
                                   key_offsets=call.key_offsets, extras=call.extras, finish=call.finish)
            self._count(path, CAPTURED if staged else SKIPPED)
            if staged:  # the summary rewritten after each case says it too (a SIGKILL leaves that one)
                writer.note("calls_by_path", self.calls_by_path())
            if staged and call.shard is not None:
                self._sharded_cases += 1
                writer.note("tensor_parallel", {
                    **self._tp_attrs(call), "row_sharded_cases": self._sharded_cases,
                    "note": "prefill rows are sharded across TP ranks: each of this rank's sharded cases "
                            "holds its own row window; the other ranks' summaries hold the rest"})
        except Exception as e:  # never into the model
            self._fail(f"{type(e).__name__}: {e}")

    def _warmup(self, frame: FrameType | None) -> bool:
        """A call outside a real step: a warm-up once the engine's step is wrapped and `steps_only` (a
        model's calls all run in steps, so any other run scores no request) unless it runs in a step that
        began unwrapped, else when a caller up the stack is one of the engine's dummy runs."""
        return (self.steps_only and self.steps.complete and not self._in_step_function(frame)) or self.in_warmup(frame)

    def _in_step_function(self, frame: FrameType | None) -> bool:
        """A caller up the stack runs the engine's step function: a step that began before its class was
        wrapped (the wrapper is installed at the first call the plugin sees), not a warm-up."""
        for _ in range(_WARMUP_DEPTH):
            if frame is None:
                return False
            if frame.f_code.co_name == self.runner.function:
                return True
            frame = frame.f_back
        return False

    def _count(self, path: str, outcome: str, reason: str | None = None) -> None:
        """One top-k call the plugin saw, by path and outcome, for the run summary (`calls_by_path`)."""
        self.paths[(path, outcome)] += 1
        if reason is not None:
            self.reasons.setdefault(path, reason)

    def calls_by_path(self) -> dict[str, Any]:
        """The run summary's count of every top-k call seen: per path, captured, skipped (by the policy,
        its budgets or the ranks), warm-up (outside real steps), not capturable (with why)."""
        out: dict[str, Any] = {}
        for (path, outcome), n in sorted(self.paths.items()):
            out.setdefault(path, {CAPTURED: 0, SKIPPED: 0, WARMUP: 0, NOT_CAPTURABLE: 0})[outcome] = n
        for path, reason in self.reasons.items():
            out[path]["why_not_capturable"] = reason
        return out

    def in_warmup(self, frame: FrameType | None) -> bool:
        """Whether a caller up the stack is one of the engine's dummy runs (host frames only)."""
        for _ in range(_WARMUP_DEPTH):
            if frame is None:
                return False
            if frame.f_code.co_name in self.warmup_functions:
                return True
            frame = frame.f_back
        return False

    def model_facts(self) -> dict[str, Any]:
        """Model id and revision every case records (the engine's subclass knows where to look)."""
        return recorded_model(lambda: None)

    def tensor_parallel(self) -> tuple[int, int] | None:
        """This process's (TP rank, TP size) as the engine publishes them, or None (not known here)."""
        return None

    def _writer(self) -> CaptureWriter:
        if self.writer is None:
            self.writer = CaptureWriter(self.directory, self.selection, rank=self._ranks()[1],
                                        max_pending_bytes=self.max_pending_bytes)
            self.writer.note("tensor_parallel", {"tp_rank": self._ranks()[0], "tp_size": self._ranks()[2],
                                                 "row_sharded_cases": 0})
            flush = functools.partial(self.close, self.exit_wait_s)
            # Forked multiprocessing children (vLLM's workers and engine core) end in os._exit right after
            # multiprocessing's exit function, which runs these; other processes run atexit.
            multiprocessing.util.Finalize(None, flush, exitpriority=10)
            atexit.register(flush)
        return self.writer

    def _forked(self) -> None:
        """First call in a child forked after this capture started: the parent's writer thread does not
        exist here and its staged matrices are the parent's; start afresh with this process's own."""
        self._pid = os.getpid()
        self.writer = None
        self.selection = PolicyState(self.policy)
        self._rank = None
        self._sharded_cases = 0
        self.steps.reset()
        self._recorded = False
        self.paths.clear()

    def _fail(self, message: str) -> None:
        self.enabled = False
        if self.error is None:
            self.error = message
            log.error("logitreplay capture disabled: %s", message)

    def _rank_wanted(self, sharded: bool) -> bool:
        if self.ranks == AUTO:
            return sharded or self._ranks()[0] == 0
        return self.ranks is None or (isinstance(self.ranks, set) and self._ranks()[0] in self.ranks)

    def _tp_attrs(self, call: Call) -> dict[str, Any]:
        tp_rank, _, tp_size = self._ranks()
        out: dict[str, Any] = {"tp_rank": tp_rank, "tp_size": tp_size, "row_sharded": call.shard is not None}
        if call.shard is not None and "sizes" not in call.shard:
            # the real steps begun so far, alike on every rank: `merge` finds a step's parts by it
            out.update(row_sharding=call.shard.get("scheme"), step=self.steps.begun)
        elif call.shard is not None:
            out.update(tp_size=len(call.shard["sizes"]), shard_rows=[call.shard["start"], call.shard["stop"]],
                       shard_sizes=call.shard["sizes"])
        return out

    def _ranks(self) -> tuple[int, int, int | None]:
        if self._rank is None:
            dist = torch.distributed
            global_rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            tp = self.tensor_parallel()
            self._rank = (global_rank, global_rank, None) if tp is None else (tp[0], global_rank, tp[1])
        return self._rank


class _Wrapped:
    """Stands in for a wrapped function or op: runs the original, then offers the call to the capture.
    Every other attribute (`.default`, overloads, the schema) is the original's."""

    def __init__(self, capture: EngineCapture, original: Callable[..., Any], site: Site) -> None:
        self._capture = capture
        self._original = original
        self._site = site
        self.__wrapped__ = original

    def __getattr__(self, name: str) -> Any:
        return getattr(self._original, name)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """Wrapping a method on its class (`SparseIndexerTopk.forward`): bound like the function was."""
        return self if instance is None else types.MethodType(self, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        capture = self._capture
        if getattr(capture._inside, "active", False):  # an outer wrapper of this same call captures
            return self._original(*args, **kwargs)
        capture._inside.active = True
        try:
            result = self._original(*args, **kwargs)
        finally:
            capture._inside.active = False
        if capture.enabled:
            capture.offer(self._site, args, kwargs, result, sys._getframe(1))
        return result


def _capturing_graph(logits: Any) -> bool:
    """True while a CUDA graph is being captured on this stream: a copy made now would be baked into the
    graph and replayed with every later step."""
    return isinstance(logits, torch.Tensor) and logits.is_cuda and torch.cuda.is_current_stream_capturing()


@functools.cache
def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)


def recorded_model(engine_model: Callable[[], tuple[str, str | None] | None]) -> dict[str, Any]:
    """The model facts every case records: from LOGITREPLAY_CAPTURE_MODEL / LOGITREPLAY_CAPTURE_REVISION,
    else from what the engine says (`engine_model`: (model, revision) or None; it may raise)."""
    model, revision = os.environ.get(ENV_MODEL), os.environ.get(ENV_REVISION)
    if model is None:
        try:
            found = engine_model()
        except Exception:
            found = None
        if found is not None:
            model, revision = found[0], revision or found[1]
    if model is None:
        return {}
    from logitreplay.capture.hf import model_provenance

    return model_provenance(model, revision, None)


__all__ = ["AUTO", "ENV_DIR", "ENV_EXIT_WAIT", "ENV_MODEL", "ENV_PENDING", "ENV_POLICY", "ENV_RANKS",
           "ENV_REVISION", "EngineCapture", "recorded_model"]
