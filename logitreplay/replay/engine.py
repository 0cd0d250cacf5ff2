"""The replay engine: cases x selectors -> supports -> verify -> time, one case in memory at a time.

Per case: rebuild the padded, poisoned matrix on the device; compute the expected values once; give
every selector its own sentinel-filled output buffer; ask `supports`, `prepare`, launch once and verify
(checks 1-4, plus any device `extra_checks`, e.g. the CUDA graph replay after a bounds change). Only the
verified selectors are timed, all of a case's together, so that the timing rounds alternate A B A B and
drift spreads over all of them. A selector that raises is recorded as an error and the others go on. A
case holding a NaN inside a row is invalid input: reported, never timed.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from logitreplay.archive import ELEMENT_BYTES, Archive, ArchiveError, Case, one_line
from logitreplay.replay.timing import Timing, TimingProtocol, time_launches
from logitreplay.replay.verify import Failure, OutputBuffer, check_output, expected_values, nan_row
from logitreplay.selectors.base import Launch, Selector

# vLLM routes a prefill chunk to DeepSelect only when its rows can be read as DeepSelect expects.
_DEEPSELECT_MAX_K = 4096
_DEEPSELECT_ROW_ALIGN = 1024


@dataclass
class SelectorResult:
    """What happened to one selector on one case.

    `status`: "ok" (verified, and `timing` holds its samples), "unsupported" (`reason` is what
    `supports` said), "failed" (a verification check failed: `failures`, first check first; `reason`
    names it) or "error" (`supports`, `prepare`, the launch or the timing raised: `reason` is the
    exception in one line)."""

    selector: str
    status: str
    reason: str | None = None
    failures: list[Failure] = field(default_factory=list)
    timing: Timing | None = None

    def to_json(self) -> dict[str, Any]:
        return {"selector": self.selector, "status": self.status, "reason": self.reason,
                "failures": [f.to_json() for f in self.failures],
                "timing": None if self.timing is None else self.timing.to_json()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SelectorResult:
        t = d.get("timing")
        timing = None if t is None else Timing(samples_us=[float(x) for x in t["samples_us"]], clock=t["clock"])
        return cls(d["selector"], d["status"], d.get("reason"), [Failure.from_json(f) for f in d["failures"]],
                   timing)


@dataclass
class CaseResult:
    """One case of a replay: its shape and source, and one `SelectorResult` per selector (in the order
    asked for; empty when the case is invalid).

    `source` is a short description for tables (synthetic distribution, or model and layer);
    `valid_bytes` the in-bounds logits bytes (the least any selector must read); `invalid` why the case
    could not be replayed (NaN inside a row), else None; `floor_us` the read floor (valid bytes / measured
    read bandwidth) when the device's bandwidth was measured; `fast_path` whether vLLM's DeepSelect
    prefill fast path would take this case, with `fast_path_note` saying why not."""

    case_id: str
    rows: int
    cols: int
    top_k: int
    dtype: str
    row_stride: int
    source: str
    valid_bytes: int
    invalid: str | None = None
    floor_us: float | None = None
    fast_path: bool = False
    fast_path_note: str = ""
    results: list[SelectorResult] = field(default_factory=list)

    def result(self, selector: str) -> SelectorResult | None:
        return next((r for r in self.results if r.selector == selector), None)

    def timed(self, selector: str) -> Timing | None:
        """The selector's timing on this case; None when it was not verified and timed."""
        res = self.result(selector)
        return None if res is None else res.timing

    def to_json(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in ("case_id", "rows", "cols", "top_k", "dtype", "row_stride", "source",
                                           "valid_bytes", "invalid", "floor_us", "fast_path", "fast_path_note")}
        d["results"] = [r.to_json() for r in self.results]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CaseResult:
        plain = {k: v for k, v in d.items() if k != "results"}
        return cls(**plain, results=[SelectorResult.from_json(r) for r in d["results"]])


@dataclass
class ReplayResult:
    """A whole replay: the `device` ("cpu", "cuda:0"), what the times are (`clock_label`), the timing
    `protocol`, the `environment` (versions, CPU, GPU), the `baseline` selector ratios are taken against,
    the `selectors` in column order, the `cases`, and `notes` (e.g. CPU protocol reductions)."""

    device: str
    clock_label: str
    protocol: TimingProtocol
    environment: dict[str, Any]
    baseline: str | None
    selectors: list[str]
    cases: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recommendation: list[dict[str, Any]] = field(default_factory=list)  # `replay --recommend` (recommend.py)

    SCHEMA = "logitreplay.replay/1"

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.SCHEMA, "device": self.device, "clock_label": self.clock_label,
                "protocol": self.protocol.to_json(), "environment": self.environment,
                "baseline": self.baseline, "selectors": list(self.selectors),
                "cases": [c.to_json() for c in self.cases], "notes": list(self.notes),
                "recommendation": list(self.recommendation)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReplayResult:
        if d.get("schema") != cls.SCHEMA:
            raise ValueError(f"not a replay result (schema {d.get('schema')!r}, expected {cls.SCHEMA!r})")
        return cls(d["device"], d["clock_label"], TimingProtocol(**d["protocol"]), d["environment"], d["baseline"],
                   list(d["selectors"]), [CaseResult.from_json(c) for c in d["cases"]], list(d["notes"]),
                   list(d.get("recommendation", [])))


@dataclass
class Prepared:
    """A selector prepared on a case and verified once; what a device `extra_check` gets. `row_starts`
    and `row_ends` are the very tensors `launch` reads, so a check may change them in place (and must
    restore them)."""

    case: Case
    selector: Selector
    launch: Launch
    output: OutputBuffer
    logits: torch.Tensor
    row_starts: torch.Tensor
    row_ends: torch.Tensor


ExtraCheck = Callable[[Prepared], list[Failure]]


def device_checks(device: torch.device) -> list[ExtraCheck]:
    """The checks a device adds to DESIGN's 1-4: on CUDA, the graph replayed after the bounds changed."""
    if device.type != "cuda":
        return []
    from logitreplay.replay.graph_check import graph_replay_check

    return [graph_replay_check]


def describe_source(case: Case) -> str:
    """A short source for tables: the synthetic distribution, or model and layer of a capture."""
    a = case.attrs
    if a.get("source") == "synthetic":
        recipe: dict[str, Any] = a["recipe"] if isinstance(a.get("recipe"), dict) else {}
        tags = [t for t, on in (("edge rows", recipe.get("ends") == "edges"),
                                ("multi-request", recipe.get("starts") == "requests"),
                                (f"stride {recipe.get('row_stride')}", recipe.get("row_stride") is not None)) if on]
        return ", ".join([str(a.get("distribution", "synthetic")), *tags])
    parts = []
    if a.get("model"):
        parts.append(str(a["model"]).rstrip("/").rsplit("/", 1)[-1])  # a local path or an org/name id
    if a.get("layer_index") is not None:
        parts.append(f"layer {a['layer_index']}")
    elif a.get("layer_name"):
        parts.append(str(a["layer_name"]))
    return " ".join(parts) or str(a.get("source", "captured"))


def fast_path(case: Case) -> tuple[bool, str]:
    """Would vLLM send this case to DeepSelect's prefill fast path (one request, rows starting at column
    0, 1024-byte aligned rows, top_k <= 4096)? Returns (eligible, why not)."""
    if case.top_k > _DEEPSELECT_MAX_K:
        return False, f"top_k {case.top_k} > {_DEEPSELECT_MAX_K}"
    if case.rows and bool((case.row_starts != 0).any()):
        return False, "rows start past column 0"
    chunk = case.attrs.get("chunk")
    if isinstance(chunk, dict) and int(chunk.get("requests", 1)) > 1:
        return False, f"{chunk['requests']} requests"
    if (case.row_stride * ELEMENT_BYTES[case.dtype]) % _DEEPSELECT_ROW_ALIGN:
        return False, f"row stride not {_DEEPSELECT_ROW_ALIGN}-byte aligned"
    return True, ""


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {one_line(e, None)}"[:300]


def case_header(case: Case, read_bandwidth: float | None = None) -> CaseResult:
    """A case's result before any selector ran: shape, source, fast-path eligibility, read floor."""
    ok, note = fast_path(case)
    result = CaseResult(case.case_id, case.rows, case.cols, case.top_k, case.dtype, case.row_stride,
                        describe_source(case), case.nbytes, fast_path=ok, fast_path_note=note)
    if read_bandwidth:
        result.floor_us = case.nbytes / read_bandwidth * 1e6
    return result


def replay_case(case: Case, selectors: Sequence[Selector], device: torch.device, protocol: TimingProtocol,
                poison: float = 1e30, extra_checks: Sequence[ExtraCheck] = (),
                read_bandwidth: float | None = None) -> CaseResult:
    """Replay one case against every selector (see the module docstring); `read_bandwidth` in bytes/s."""
    result = case_header(case, read_bandwidth)
    bad = nan_row(case, device)
    if bad is not None:
        result.invalid = f"NaN inside row {bad}"
        return result
    logits = case.padded(poison=poison, device=device)
    starts = torch.from_numpy(case.row_starts).to(device)
    ends = torch.from_numpy(case.row_ends).to(device)
    expected = expected_values(logits, starts, ends, case.top_k)
    launches: dict[str, Launch] = {}
    for sel in selectors:
        res = SelectorResult(sel.name, "ok")
        result.results.append(res)
        try:
            why = sel.supports(case, device)
            if why is not None:
                res.status, res.reason = "unsupported", why
                continue
            out = OutputBuffer(case.rows, case.top_k, device)
            launch = sel.prepare(logits, starts, ends, case.top_k, out.view)
            launch()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            failures = check_output(case, logits, starts, ends, out, expected)
            if not failures:
                prepared = Prepared(case, sel, launch, out, logits, starts, ends)
                failures = [f for check in extra_checks for f in check(prepared)]
        except Exception as e:
            res.status, res.reason = "error", _error_text(e)
            continue
        if failures:
            res.status, res.failures = "failed", sorted(failures, key=lambda f: f.check)
            res.reason = f"check {res.failures[0].check} ({res.failures[0].name})"
        else:
            launches[sel.name] = launch
    for name, timing in _time(launches, device, protocol).items():
        res = next(r for r in result.results if r.selector == name)
        if isinstance(timing, Timing):
            res.timing = timing
        else:
            res.status, res.reason = "error", timing
    return result


def _time(launches: dict[str, Launch], device: torch.device,
          protocol: TimingProtocol) -> dict[str, Timing | str]:
    """Time all launches together; if that raises, time each alone so one bad launch spoils only itself."""
    if not launches:
        return {}
    try:
        return dict(time_launches(launches, device, protocol))
    except Exception:
        out: dict[str, Timing | str] = {}
        for name, launch in launches.items():
            try:
                out[name] = time_launches({name: launch}, device, protocol)[name]
            except Exception as e:
                out[name] = f"timing raised {_error_text(e)}"
        return out


@dataclass(frozen=True)
class Unreadable:
    """A stored case that could not be read (damaged chunk, malformed attributes): it is reported as an
    invalid case with the archive's one-line error, and the other cases still replay."""

    case_id: str
    reason: str


def replay(cases: Iterable[Case | Unreadable], selectors: Sequence[Selector], device: torch.device,
           protocol: TimingProtocol, poison: float = 1e30, extra_checks: Sequence[ExtraCheck] = (),
           read_bandwidth: float | None = None) -> Iterator[CaseResult]:
    """Replay cases one at a time (each is dropped before the next is read)."""
    for case in cases:
        if isinstance(case, Unreadable):
            yield CaseResult(case.case_id, 0, 0, 0, "-", 0, "unreadable", 0, invalid=case.reason)
            continue
        yield replay_case(case, selectors, device, protocol, poison, extra_checks, read_bandwidth)


def open_cases(locations: Sequence[str], suite: str | None, scale: str,
               start: int = 0) -> tuple[Iterator[Case | Unreadable], int, list[str]]:
    """Cases to replay, how many, and the archives' pinned locations (a Hub URL resolved to its commit,
    for the record and for isolated children, which must read the very same data): every complete case
    of each archive (path or URL), then the built-in suite if one is named, skipping the first `start`
    without reading them (an isolated child resumes after a crash this way). Archives are opened (and
    so checked) before anything runs.

    A suite is regenerated case by case from its recipes rather than cached on disk: generation is
    bit-identical everywhere and costs less than writing and re-reading the ~3.5 GB full-scale suite
    (a fresh GPU machine would pay that write on every first run)."""
    from logitreplay.datasets import synth

    archives = [Archive.open(loc) for loc in locations]
    entries: list[tuple[Archive, str] | synth.Recipe] = [(a, cid) for a in archives for cid in a.case_ids()]
    if suite is not None:
        entries += synth.recipes(suite, scale)

    def stream() -> Iterator[Case | Unreadable]:
        for entry in entries[start:]:
            if isinstance(entry, synth.Recipe):
                yield synth.generate(entry)
                continue
            archive, case_id = entry
            try:
                yield archive.read(case_id)
            except ArchiveError as e:
                yield Unreadable(case_id, f"unreadable: {e}")

    return stream(), len(entries), [a.location for a in archives]


def environment(device: torch.device) -> dict[str, Any]:
    """What a reader needs to trust or reproduce the numbers: versions, CPU, and the GPU on CUDA."""
    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update({"gpu": props.name, "gpu_capability": f"{props.major}.{props.minor}",
                    "gpu_memory_bytes": props.total_memory, "cuda": torch.version.cuda})
    return env


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
