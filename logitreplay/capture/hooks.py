"""Module hooks that capture the score matrix an indexer module feeds to its top-k.

(About 450 lines: one `IndexerCapture` whose pre-hook, top-k recorder, post-hook and call counting share
per-call state that must stay off the model's thread; splitting it would spread that invariant over
files.)

An indexer module (transformers' `DeepseekV32Indexer`, `GlmMoeDsaIndexer`, or any module a user names)
computes a float32 score matrix [B, S, T] inside its forward and returns `topk(scores).indices`. The
matrix itself is a local variable, so it is intercepted at the one place it is visible: the call to top-k.

Cost is the design constraint. An active `TorchFunctionMode` costs ~0.25 ms per indexer call (every torch
call inside the module goes through Python), so it is never entered speculatively: a forward pre-hook
looks only at input shapes and asks the policy whether it wants this call; only then is the mode entered,
and a forward hook registered with `always_call=True` exits it (also when the forward raised). A call the
policy does not want costs one pre-hook (a few microseconds of Python, no device work); a detached
capture costs nothing.

Row bounds come from the mask argument: boolean (sdpa: True = attend) or additive float (eager: 0 = attend,
a large negative or -inf = masked). Each row's attended columns must be one contiguous range [start, end)
(causal, with left padding giving non-zero starts); fully masked rows (padding queries) become empty
rows [0, 0). The bounds are computed on the device and never read here: the writer checks them on the
host, off the model's thread (a row with a non-contiguous range fails it there). Some transformers
versions pass no mask when attention is plainly causal and mask keys after each query's `position_ids`
instead; then the bounds are [0, position + 1), and since the width is not visible before the forward,
such calls enter the mode when the policy wants their layer and are checked against the width
afterwards. The indices the module's top-k returned are kept as `reference_indices` in our semantics:
relative to start, int32. When a row is shorter than top_k the module's own top-k still returns k indices,
the surplus pointing at masked cells; those are mapped faithfully to -1 and moved to the tail.

Every indexer call is also counted, wanted or not, per forward pass of the model given to `attach`
(layer, width, rows, score dtype, prefill/decode), with the forward's time: CUDA events around it on a
GPU (read at `close`, never on the model's thread), wall clock on a CPU. `close` stores them as the
writer's call record (`archive/calls.py`), which `replay --per-forward` weights stored cases by. The
width of a call without a mask is its largest position + 1, kept on the device until `close`; the score
dtype is the one seen when a call of that module was captured (None when none was). `kind` is what the
driver says (`capture.kind`), else "decode" for one query row per request and "prefill" otherwise.

Any error on this path is logged once and disables the capture; it never reaches the model's forward.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from logitreplay.archive.calls import CallCount, CallRecord, Forward, write_calls
from logitreplay.capture.policy import decode_rows
from logitreplay.capture.writer import CaptureWriter
from logitreplay.errors import CaptureError, LayoutError

log = logging.getLogger("logitreplay.capture")

# transformers >= 5.11: `model.layers.N.self_attn.indexer`
INDEXER_CLASSES = ("DeepseekV32Indexer", "GlmMoeDsaIndexer")
_TOPK = (torch.topk, torch.Tensor.topk)
_LAYER_NUMBER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


@dataclass(frozen=True)
class _Site:
    name: str
    layer_index: int
    mask_arg: int  # position of `attention_mask` among the forward's positional arguments
    positions_arg: int | None  # position of `position_ids`, used when no mask is passed
    top_k: int | None  # the module's configured top-k (`index_topk`), when it has one


@dataclass
class _Call:
    """One indexer call as seen on the model's thread; `width` may still be a device scalar."""

    site: _Site
    width: int | torch.Tensor | None
    rows: int
    kind: str


@dataclass
class _PendingForward:
    """A forward's calls and its timing, resolved at `close`: CUDA events, or the wall time already."""

    calls: list[_Call] = field(default_factory=list)
    events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
    wall_us: float | None = None


class _TopkRecorder(TorchFunctionMode):
    """Active only inside one wanted indexer forward: remembers the first top-k over the last dimension
    of a matrix of the expected [B, S, T] shape (T None: any), and the indices it returned."""

    def __init__(self, shape: tuple[int, int, int | None]) -> None:
        super().__init__()
        self.shape = shape
        self.scores: torch.Tensor | None = None
        self.indices: torch.Tensor | None = None

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.scores is None and func in _TOPK and args and isinstance(args[0], torch.Tensor):
            x = args[0]
            dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
            largest = kwargs.get("largest", args[3] if len(args) > 3 else True)
            b, s, t = self.shape
            if x.dim() == 3 and x.shape[:2] == (b, s) and t in (None, x.shape[2]) and dim in (-1, 2) and largest:
                self.scores, self.indices = x, out[1]
        return out


class IndexerCapture:
    """Hooks on indexer modules that hand each wanted score matrix to a `CaptureWriter`.

    `provenance` is merged into every case's attributes (model, revision, engine, ...); `chunk` is set by
    the driver before each forward (token range of the chunk) and recorded with the cases it produces.
    """

    def __init__(self, writer: CaptureWriter, provenance: dict[str, Any] | None = None) -> None:
        self.writer = writer
        self.selection = writer.selection
        self.provenance = dict(provenance or {})
        self.chunk: dict[str, Any] = {}
        self.enabled = True
        self.error: str | None = None
        self.sites: list[_Site] = []
        self._handles: list[Any] = []
        # (site, recorder, mask or None, position_ids when there is no mask, the call's record)
        self._active: tuple[_Site, _TopkRecorder, torch.Tensor | None, torch.Tensor | None, _Call] | None = None
        self._device_names: dict[str, str] = {}
        self.kind: str | None = None  # "prefill" or "decode" when the driver knows; else inferred per call
        self._forwards: list[_PendingForward] = []
        self._current = _PendingForward()
        self._started: tuple[float, torch.cuda.Event | None] | None = None
        self._dtypes: dict[str, str] = {}  # module name -> dtype of the score matrices it was seen to make
        self._timer: str | None = None

    def attach(self, model: torch.nn.Module, pattern: str | None = None,
               classes: Sequence[str] = INDEXER_CLASSES) -> list[str]:
        """Hook every module whose class name is in `classes` or whose qualified name fully matches the
        regular expression `pattern`; returns their names. Raises `CaptureError` when none matches."""
        rx = re.compile(pattern) if pattern else None
        for order, (name, module) in enumerate(model.named_modules()):
            if type(module).__name__ not in classes and not (rx and rx.fullmatch(name)):
                continue
            params = _forward_params(name, module)
            site = _Site(name, _layer_index(name, module, order), params.index("attention_mask"),
                         params.index("position_ids") if "position_ids" in params else None,
                         _int_or_none(getattr(module, "index_topk", None)))
            self._handles.append(module.register_forward_pre_hook(
                lambda m, a, k, s=site: self._pre(s, a, k), with_kwargs=True))
            self._handles.append(module.register_forward_hook(
                lambda m, a, k, o, s=site: self._post(s, o), with_kwargs=True, always_call=True))
            self.sites.append(site)
        if not self.sites:
            what = f"class in {', '.join(classes)}" + (f" or name matching {pattern!r}" if pattern else "")
            raise CaptureError(f"no indexer module found ({what})")
        self._handles.append(model.register_forward_pre_hook(lambda m, a: self._begin_forward(m)))
        self._handles.append(model.register_forward_hook(lambda m, a, o: self._end_forward(), always_call=True))
        return [s.name for s in self.sites]

    def detach(self) -> None:
        """Remove every hook: a detached capture costs the model nothing. `attach` may be called again."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.sites.clear()
        self._exit_active()

    def close(self) -> dict[str, Any]:
        """Detach, flush the writer, write the run summary and the call record; returns the summary."""
        self.detach()
        summary = self.writer.close()
        try:
            record = self.call_record()
            if record.forwards:
                write_calls(self.writer.archive, record)
            summary.update(forwards=len(record.forwards), calls=sum(f.n_calls for f in record.forwards))
        except Exception as e:  # the cases are written; a lost call record must not hide them
            self._fail(f"writing the call record: {type(e).__name__}: {e}")
        if self.error and not summary.get("error"):
            summary["error"] = self.error
        return summary

    def call_record(self) -> CallRecord:
        """The calls counted so far, per forward, with device values read now (off the model's path)."""
        pending = self._forwards + ([self._current] if self._current.calls else [])
        forwards = []
        for f in pending:
            wall = f.wall_us
            if f.events is not None:
                f.events[1].synchronize()
                wall = f.events[0].elapsed_time(f.events[1]) * 1e3
            counts = Counter((c.site.layer_index, int(c.width) if c.width is not None else 0, c.rows,
                              self._dtypes.get(c.site.name), c.kind) for c in f.calls)
            forwards.append(Forward([CallCount(*key, count=n) for key, n in counts.items()], wall))
        return CallRecord(self.writer.prefix, str(self.provenance.get("engine", "transformers")), self._timer,
                          forwards)

    # -- forward hooks on the model (time the forward, group the calls it made)

    def _begin_forward(self, model: torch.nn.Module) -> None:
        try:
            self._flush_forward()  # calls made outside a forward of the model form their own group
            device = next(model.parameters(), torch.empty(0)).device
            event = None
            if device.type == "cuda":
                event = torch.cuda.Event(enable_timing=True)
                event.record(torch.cuda.current_stream(device))
            self._timer = "cuda-events" if event is not None else "wall"
            self._started = (time.perf_counter(), event)
        except Exception as e:
            self._fail(f"timing the forward: {type(e).__name__}: {e}")

    def _end_forward(self) -> None:
        started, self._started = self._started, None
        if started is None:
            return
        try:
            t0, event = started
            if event is not None:
                end = torch.cuda.Event(enable_timing=True)
                end.record(torch.cuda.current_stream(event.device))
                self._current.events = (event, end)
            else:
                self._current.wall_us = (time.perf_counter() - t0) * 1e6
            self._forwards.append(self._current)
            self._current = _PendingForward()
        except Exception as e:
            self._fail(f"timing the forward: {type(e).__name__}: {e}")

    def _flush_forward(self) -> None:
        if self._current.calls:
            self._forwards.append(self._current)
            self._current = _PendingForward()

    # -- hooks (run inside the model's forward: never raise)

    def _pre(self, site: _Site, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            hidden = args[0] if args else kwargs.get("hidden_states")
            mask = _argument(args, kwargs, site.mask_arg, "attention_mask")
            positions = None if mask is not None else _argument(args, kwargs, site.positions_arg, "position_ids")
            call = self._count(site, hidden, mask, positions)
            if not self.enabled or self._active is not None:
                return
            if self.writer.failed:  # it has logged why; stop asking
                self.enabled = False
                return
            if mask is None:
                if not isinstance(positions, torch.Tensor):
                    raise LayoutError(f"{site.name}: forward got neither an attention_mask nor position_ids")
                if not self.selection.wants_layer(site.layer_index):
                    return
                width = None
            else:
                width = int(mask.shape[-1])
                rows = None if call is None else decode_rows(call.kind, call.rows)
                if not self.selection.wants(site.layer_index, width, rows):
                    return
            if call is None or not isinstance(hidden, torch.Tensor):
                raise LayoutError(f"{site.name}: forward got no hidden_states tensor")
            recorder = _TopkRecorder((int(hidden.shape[0]), int(hidden.shape[1]), width))
            recorder.__enter__()
            self._active = (site, recorder, mask, positions, call)
        except Exception as e:
            self._fail(f"{type(e).__name__}: {e}")

    def _count(self, site: _Site, hidden: Any, mask: torch.Tensor | None, positions: Any) -> _Call | None:
        """Count the call in the current forward (no host read of device data); None without hidden states."""
        if not isinstance(hidden, torch.Tensor) or hidden.dim() < 2:
            return None
        b, s = int(hidden.shape[0]), int(hidden.shape[1])
        width: int | torch.Tensor | None = None
        if mask is not None:
            width = int(mask.shape[-1])
        elif isinstance(positions, torch.Tensor) and positions.numel():
            width = positions.amax() + 1
        call = _Call(site, width, b * s, self.call_kind(s))
        self._current.calls.append(call)
        return call

    def call_kind(self, queries: int) -> str:
        """What an indexer call with `queries` query rows per request is: what the driver says
        (`self.kind`), else a decode step for one row per request (generate's steps after the prompt)."""
        return self.kind or ("decode" if queries == 1 else "prefill")

    def _post(self, site: _Site, output: Any) -> None:
        active = self._active
        if active is None or active[0] is not site:
            return
        self._exit_active()
        if output is None:  # the forward raised; its exception propagates, nothing to keep
            return
        try:
            _, recorder, mask, positions, call = active
            if recorder.scores is None or recorder.indices is None:
                raise LayoutError(f"{site.name}: no top-k over a {recorder.shape} score matrix in its forward")
            call.width = int(recorder.scores.shape[-1])
            self._dtypes[site.name] = str(recorder.scores.dtype).removeprefix("torch.")
            self._keep(site, recorder.scores, recorder.indices, mask, positions)
        except Exception as e:
            self._fail(f"{type(e).__name__}: {e}")

    def _keep(self, site: _Site, scores: torch.Tensor, indices: torch.Tensor, mask: torch.Tensor | None,
              positions: torch.Tensor | None) -> None:
        if scores.dtype not in (torch.float32, torch.bfloat16):
            raise LayoutError(f"{site.name}: score matrix is {scores.dtype}, expected float32 or bfloat16")
        b, s, t = scores.shape
        attended = None
        if mask is not None:
            starts, ends, attended = row_bounds(mask, (b, s, t), site.name)
        elif not self.selection.wants(site.layer_index, t, decode_rows(self.call_kind(s), b * s)):
            return
        else:
            assert positions is not None
            starts, ends = causal_bounds(positions, (b, s, t), site.name)
        matrix = scores.reshape(b * s, t)
        top_k = site.top_k or int(indices.shape[-1])
        reference = relative_indices(indices.reshape(b * s, -1), starts, ends, top_k)
        attrs = {
            **self.provenance,
            "layer_name": site.name,
            "layer_index": site.layer_index,
            "index_source": "input of the indexer module's top-k",
            "reference_source": "the module's top-k indices; picks outside [start, end) mapped to -1",
            "chunk": dict(self.chunk),
            "device": self._device_name(scores.device),
        }
        if self.call_kind(s) == "decode":
            # next_n = the request's query rows, each ending one column later (the causal mask of a
            # multi-token step): vLLM's (batch, next_n) per-row seq_lens; filled in from the ends on the
            # host (`archive.decode.capture_rows`), where the rows are also rebased to column 0.
            attrs.update(kind="decode", decode={"next_n": s, "per_row": s > 1, "max_model_len": t,
                                                "backend": "torch.topk", "speculative": s > 1})
        self.writer.submit(matrix, starts, ends, reference, top_k=top_k, row_stride=t, layer_index=site.layer_index,
                           layer_name=site.name, requests=b, attrs=attrs, attended=attended)

    def _exit_active(self) -> None:
        if self._active is not None:
            recorder = self._active[1]
            self._active = None
            try:
                recorder.__exit__(None, None, None)
            except Exception as e:
                self._fail(f"leaving the top-k recorder: {e}")

    def _fail(self, message: str) -> None:
        self.enabled = False
        self._exit_active()
        if self.error is None:
            self.error = message
            log.error("logitreplay capture disabled: %s", message)

    def _device_name(self, device: torch.device) -> str:
        key = str(device)
        if key not in self._device_names:
            self._device_names[key] = torch.cuda.get_device_name(device) if device.type == "cuda" else key
        return self._device_names[key]


def row_bounds(mask: torch.Tensor, shape: tuple[int, int, int], where: str
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row [start, end) of the attended columns of a [B, S, T] mask (broadcastable) and the number of
    attended columns, all on the mask's device and never read on the host (that would be a sync): a row
    whose attended columns are not one contiguous range has end - start != attended, which the writer
    checks on the host. Raises `LayoutError` for a mask whose dtype or shape does not fit."""
    b, s, t = shape
    if mask.dtype == torch.bool:
        valid = mask
    elif mask.is_floating_point():
        valid = mask > torch.finfo(mask.dtype).min / 2
    else:
        raise LayoutError(f"{where}: attention mask of dtype {mask.dtype}, expected bool or float")
    if mask.dim() == 4 and mask.shape[1] == 1:
        valid = valid[:, 0]
    try:
        valid = valid.expand(b, s, t).reshape(b * s, t)
    except RuntimeError:
        raise LayoutError(f"{where}: attention mask {tuple(mask.shape)} does not match scores {shape}") from None
    counts = valid.sum(-1)
    as_int = valid.to(torch.uint8)
    starts = as_int.argmax(-1)
    ends = t - as_int.flip(-1).argmax(-1)
    empty = counts == 0
    starts = starts.masked_fill(empty, 0)
    ends = ends.masked_fill(empty, 0)
    return starts, ends, counts


def causal_bounds(positions: torch.Tensor, shape: tuple[int, int, int], where: str
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Row bounds when keys after each query's position are masked: [0, position + 1), clipped to T."""
    b, s, t = shape
    try:
        ends = (positions.to(torch.int64) + 1).clamp(0, t).expand(b, s).reshape(b * s)
    except RuntimeError:
        raise LayoutError(f"{where}: position_ids {tuple(positions.shape)} do not match scores {shape}") from None
    return torch.zeros_like(ends), ends


def relative_indices(indices: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, top_k: int
                     ) -> torch.Tensor:
    """Absolute column indices (rows, k) -> our semantics: relative to start, int32, in-range picks
    first (in their original order), -1 for picks outside [start, end), padded with -1 to `top_k`."""
    idx = indices.to(torch.int64)
    lo, hi = starts[:, None].to(idx.device), ends[:, None].to(idx.device)
    inside = (idx >= lo) & (idx < hi)
    rel = torch.where(inside, idx - lo, torch.full_like(idx, -1))
    order = torch.argsort((~inside).to(torch.uint8), dim=1, stable=True)
    rel = rel.gather(1, order)
    if rel.shape[1] < top_k:
        rel = torch.nn.functional.pad(rel, (0, top_k - rel.shape[1]), value=-1)
    return rel[:, :top_k].to(torch.int32)


def _forward_params(name: str, module: torch.nn.Module) -> list[str]:
    params = list(inspect.signature(module.forward).parameters)
    if "attention_mask" not in params:
        raise CaptureError(f"{name} ({type(module).__name__}): forward has no 'attention_mask' argument; "
                           "cannot derive row bounds")
    return params


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], position: int | None, name: str) -> Any:
    if position is not None and len(args) > position:
        return args[position]
    return kwargs.get(name)


def layer_number(name: str) -> int | None:
    """The first dot-separated part of a module or cache name that is a number (`model.layers.7.x` -> 7)."""
    m = _LAYER_NUMBER.search(name)
    return int(m.group(1)) if m else None


def _layer_index(name: str, module: torch.nn.Module, order: int) -> int:
    idx = getattr(module, "layer_idx", None)
    if isinstance(idx, int):
        return idx
    number = layer_number(name)
    return order if number is None else number


def _int_or_none(x: Any) -> int | None:
    return int(x) if isinstance(x, int) and x > 0 else None


__all__ = ["INDEXER_CLASSES", "CaptureError", "IndexerCapture", "layer_number", "relative_indices", "row_bounds"]
