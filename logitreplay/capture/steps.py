"""The serving plugins' call record: every indexer top-k call a process saw, stored or not, per engine step.

Where an engine's step is, and how a dummy run or a replayed graph is told from a real step, is its
`Runner` (vLLM's in `vllm_plugin`, SGLang's in `sglang_plugin`); the rest is shared. For vLLM a step
is one call of the model runner's `execute_model(scheduler_output, ...)` (vLLM 0.33's `GPUModelRunner`
in `vllm/v1/worker/gpu_model_runner.py`, and V2's, the default where supported, in
`vllm/v1/worker/gpu/model_runner.py`): it prepares the step's inputs, runs the model once under
`set_forward_context` (every layer's indexer) and computes the logits; it returns None and the engine
calls `sample_tokens` next, which is not part of the step timed here. `execute_model` is wrapped on each of
those classes found loaded (`install`, retried by the plugin on every intercepted call until both are:
the runner modules are imported when the worker builds its runner, after `register`, and vLLM's warmup
runs make indexer calls before the first real step). A wrapper on the class is the exact boundary; the
calling frames alone would give only when a step's first indexer call happened, not when it ended.

The step's time: on CUDA, two CUDA events recorded on the current stream as `execute_model` is entered and
as it returns (recording is asynchronous: no sync), read once both are complete (an `Event.query`, never a
wait, at the next step; at `record`, after the run, a wait). It measures the device's span of the step:
from the stream reaching the start marker (when the host entered the step, or later if the previous
step's work was still running) to the end of the last work the step enqueued on that stream; the
indexer's top-k runs on that stream. Work the step left on other streams and `sample_tokens` are not in
it. Without CUDA (a CPU run) it is the host's wall time of `execute_model` (`timer: wall`).

Not steps: V2's `execute_model(dummy_run=True)` (its `_dummy_run`) is not recorded, nor timed (an event
recorded while a CUDA graph is captured would be baked into the graph); calls made in it, or under any of
vLLM's other dummy runs, or while a graph is captured, are not counted (the plugin's rules for staging).
Calls made outside a wrapped step (a runner class not found, a subclass overriding `execute_model`
without calling it) form one untimed forward per run of such calls.

Another engine's step is a `Runner` (the SGLang plugin's: `ModelRunner.forward`, whose dummy runs are
SGLang's capture mode and whose CUDA-graph replays are counted as `graph_steps`, their calls unseen).
"""

from __future__ import annotations

import functools
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from logitreplay.archive.calls import CallCount, CallRecord, Forward

EVENTS, WALL = "cuda-events", "wall"


@dataclass(frozen=True)
class Runner:
    """Where an engine's step is: `cls.function` in each of `modules`, and how a call of it tells a dummy
    run (`dummy(args, kwargs)`) and a replayed CUDA graph (`graph_replayed(result)`: a step whose indexer
    calls ran inside a graph, so no Python saw them) from a real eager step."""

    engine: str
    modules: tuple[str, ...]
    cls: str
    function: str
    dummy: Callable[[tuple[Any, ...], dict[str, Any]], bool]
    graph_replayed: Callable[[Any], bool] = lambda result: False


@dataclass
class _Step:
    calls: Counter[tuple[int, int, int, str | None, str]] = field(default_factory=Counter)
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
    started: float | None = None  # perf_counter at entry, for the wall timer
    wall_us: float | None = None


class Steps:
    """The steps and the calls of one process (the model's thread enters and counts; `record` reads)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.graph_steps = 0  # real steps run as a replayed CUDA graph: their calls are not counted
        self.begun = 0  # real steps begun (dummy runs not): every TP rank runs the same steps
        self.timer: str | None = None
        self._done: list[_Step] = []
        self._current: _Step | None = None  # the real step running now
        self._loose = _Step()  # calls outside any wrapped step
        self._depth = 0  # nested execute_model calls (a subclass calling its base): the outer one is the step
        self._dummy = False
        self._patched: list[tuple[type, Callable[..., Any]]] = []

    @property
    def complete(self) -> bool:
        """Every runner module's class is wrapped (until then `install` is retried, a look-up in
        `sys.modules` per module: a module imported later, V2's after V1's, has its own class). The
        modules are the release's (`vllm_versions`): 0.34 has no V1 runner, so it completes there too."""
        return len(self._patched) == len(self.runner.modules)

    @property
    def counted(self) -> bool:
        return bool(self._done or self._loose.calls or (self._current is not None and self._current.calls))

    @property
    def in_step(self) -> bool:
        """A real step is running (not a dummy run): its calls are the model's."""
        return self._current is not None

    @property
    def in_dummy_step(self) -> bool:
        return self._dummy

    def install(self) -> int:
        """Wrap `GPUModelRunner.execute_model` on each runner module imported by now; returns how many are
        wrapped. Cheap when there is nothing new: a look-up in `sys.modules` per runner module."""
        r = self.runner
        for name in r.modules:
            cls = getattr(sys.modules.get(name), r.cls, None)
            original = getattr(cls, r.function, None) if isinstance(cls, type) else None
            if original is None or getattr(original, "__logitreplay_steps__", None) is not None:
                continue
            assert isinstance(cls, type)
            setattr(cls, r.function, self._wrap(original))
            self._patched.append((cls, original))
        return len(self._patched)

    def uninstall(self) -> None:
        for cls, original in reversed(self._patched):
            setattr(cls, self.runner.function, original)
        self._patched.clear()

    def reset(self) -> None:
        """A forked child: the parent's steps are the parent's (the class wrappers stay and are this)."""
        self._done, self._current, self._loose = [], None, _Step()
        self._depth, self._dummy = 0, False
        self.graph_steps = self.begun = 0

    def count(self, layer: int, width: int, rows: int, dtype: str | None, kind: str) -> None:
        step = self._current
        if step is None:
            step = self._loose
        self._loose_ends(step)
        step.calls[(layer, width, rows, dtype, kind)] += 1

    def record(self, writer: str) -> CallRecord:
        """The steps with at least one counted call, oldest first, their times read now (a wait for
        events still pending: call it after the run)."""
        forwards = []
        for step in self._done + [s for s in (self._current, self._loose) if s is not None and s.calls]:
            if step.events is not None and step.wall_us is None:
                step.events[1].synchronize()
                step.wall_us = step.events[0].elapsed_time(step.events[1]) * 1e3
            if step.calls:
                forwards.append(Forward([CallCount(*k, count=n) for k, n in step.calls.items()], step.wall_us))
        return CallRecord(writer, self.runner.engine, self.timer, forwards)

    # -- the step wrapper (on the model's thread: never raises into vLLM)

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def execute_model(runner: Any, *args: Any, **kwargs: Any) -> Any:
            outer = self._depth == 0
            self._depth += 1
            if outer:
                self._begin(self.runner.dummy(args, kwargs), getattr(runner, "device", None))
            result = None
            try:
                result = original(runner, *args, **kwargs)
                return result
            finally:
                self._depth -= 1
                if outer:
                    self._end(result)

        execute_model.__logitreplay_steps__ = self  # type: ignore[attr-defined]
        return execute_model

    def _begin(self, dummy: bool, device: Any) -> None:
        """Start a step; CUDA events time it when the runner's device (`GPUModelRunner.device`) is CUDA."""
        self._dummy = dummy
        if dummy:
            return
        self.begun += 1
        try:
            self._loose_ends(None)
            self._resolve()
            step = _Step()
            on_cuda = isinstance(device, torch.device | str) and torch.device(device).type == "cuda"
            if on_cuda and torch.cuda.is_initialized() and not torch.cuda.is_current_stream_capturing():
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                step.events = (start, torch.cuda.Event(enable_timing=True))
            step.started = time.perf_counter()
            self._current = step
        except Exception:  # a step not timed is still counted, as an untimed forward
            self._current = None

    def _end(self, result: Any) -> None:
        step, self._current, self._dummy = self._current, None, False
        if step is None:
            return
        if not step.calls and self.runner.graph_replayed(result):
            self.graph_steps += 1
        try:
            if step.events is not None:
                step.events[1].record()
                self.timer = EVENTS
            elif step.started is not None:
                step.wall_us = (time.perf_counter() - step.started) * 1e6
                self.timer = self.timer or WALL
        except Exception:
            step.events = None
        if step.calls:
            self._done.append(step)

    def _loose_ends(self, into: _Step | None) -> None:
        """Calls outside steps form a forward of their own, closed when a step starts (`into` None) or
        counts (`into` a step)."""
        if into is not self._loose and self._loose.calls:
            self._done.append(self._loose)
            self._loose = _Step()

    def _resolve(self) -> None:
        """Read the times of finished steps whose events are complete (`query` never waits), so that a
        long run holds few events."""
        for step in reversed(self._done):
            if step.events is None:
                if step.wall_us is not None:
                    break  # the older ones were read before it
                continue  # an untimed forward of loose calls
            if step.events[1].query():
                step.wall_us = step.events[0].elapsed_time(step.events[1]) * 1e3
                step.events = None


__all__ = ["EVENTS", "WALL", "Runner", "Steps"]
