"""The replay engine: cases x selectors -> supports -> verify -> time, one case in memory at a time.

Per case (`replay_case`): refuse a case whose padded matrix, expected values and per-selector copies do
not fit the device's free memory, and a case holding a NaN inside a row (invalid input: reported,
never timed); rebuild the padded, poisoned matrix on the device once (the *original* inputs) and compute
the expected values from it once. Then, per selector, in one place (`_verify_selector`):

  1. `supports`: None, or the reason it is reported unsupported;
  2. a fresh copy of the inputs (matrix storage with its poison, row starts, row ends) and a
     sentinel-filled output buffer of its own;
  3. `prepare`, one launch, checks 1-4, then the device's extra checks (5: CUDA graph replay); where
     check 3 finds wrong values (or `--tolerate-recall` judges it on recall), their damage (recall.py);
  4. check 6: its copy of the inputs is still bit for bit the original (a selector writing into its
     logits or bounds fails itself, never the next selector).

The verified selectors are timed together (`_time`: rounds alternate A B A B so drift spreads over all
of them; if that raises, each alone), each on its own copy, with its output buffer reset first. After
timing (`_after_timing`), the output of the last timed call must pass checks 1-4 again (check 7) and the
inputs check 6 again: a selector that does the work only on the verified call, or breaks while timed, is
FAILED and none of its time is shown. The outputs of the selectors that passed give the case's ties at
the k-th value, each one's tie policy and each pair's agreement on index sets (ties.py). With `determinism`, each selector that passed is then rerun that
many times, as it is timed, and its index sets compared run to run (determinism.py).

Whatever a selector raises, `SystemExit` and `KeyboardInterrupt` included, is that selector's error,
except a real Ctrl-C (seen by the SIGINT handler installed for the run), which stops the run.
CUDA errors are contained there too (`_verify_selector`, `_time`, the reruns, where selector code runs;
see cuda_errors.py): after any error the context is probed, and a lost one (a sticky error) raises
`DeviceLost` with the case's partial result, so that the caller continues in fresh processes.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from logitreplay.archive import ELEMENT_BYTES, Case
from logitreplay.archive.guards import check_memory
from logitreplay.archive.shape import kind_for
from logitreplay.errors import ArchiveError, one_line
from logitreplay.replay.cuda_errors import DeviceLost, raise_if_lost
from logitreplay.replay.determinism import rerun
from logitreplay.replay.fast_path import fast_path
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.recall import Damage
from logitreplay.replay.results import CaseResult, SelectorResult
from logitreplay.replay.sources import Unreadable, describe_source
from logitreplay.replay.ties import agreement, row_digests, tie_report
from logitreplay.replay.timing import time_launches
from logitreplay.replay.verify import (
    TIMED,
    TIMED_CHECK,
    ExtraCheck,
    Failure,
    Inputs,
    OutputBuffer,
    Prepared,
    check_output,
    damage_of,
    expected_values,
    nan_row,
)
from logitreplay.selectors.base import Launch, Selector, prepare_for


def device_checks(device: torch.device) -> list[ExtraCheck]:
    """The checks a device adds to checks 1-4 (docs/design.md): on CUDA, the graph replayed after the bounds changed."""
    if device.type != "cuda":
        return []
    from logitreplay.replay.graph_check import graph_replay_check

    return [graph_replay_check]


def _error_text(e: BaseException) -> str:
    """`Type: message`; a MemoryError (host memory exhausted, often without a message) says so."""
    text = one_line(e, None) or ("out of host memory" if isinstance(e, MemoryError) else "")
    return f"{type(e).__name__}: {text}"[:300] if text else type(e).__name__


# -- Ctrl-C: a real one stops the run; a KeyboardInterrupt a plugin raises is the plugin's error.

_ctrl_c = threading.Event()


@contextlib.contextmanager
def _watch_ctrl_c() -> Iterator[None]:
    """Note a real SIGINT (then behave as before: raise KeyboardInterrupt) while the block runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        if previous is signal.SIG_IGN:
            return
        _ctrl_c.set()
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    _ctrl_c.clear()
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _plugin_error(e: BaseException) -> str:
    """The one-line error of what selector code raised; re-raises a real Ctrl-C."""
    if isinstance(e, KeyboardInterrupt) and _ctrl_c.is_set():
        raise e
    if isinstance(e, SystemExit):
        return f"SystemExit({e.code!r}) raised by the selector"
    return _error_text(e)


class Unbuildable:
    """Stands in for a selector whose factory failed: every case reports that error, others still run."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def supports(self, case: Case, device: torch.device) -> str | None:
        raise RuntimeError(self.reason)

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        raise RuntimeError(self.reason)


# -- one case


def case_header(case: Case, read_bandwidth: float | None = None) -> CaseResult:
    """A case's result before any selector ran: shape, source, fast-path eligibility, read floor, and its
    kind as `auto` dispatches it (the label, else what the bounds show), so a rule fitted on the report
    groups cases as `auto` will see them."""
    ok, note = fast_path(case)
    kind, _ = kind_for(case.attrs, case.row_starts, case.row_ends, case.cols, case.top_k)
    result = CaseResult(case.case_id, case.rows, case.cols, case.top_k, case.dtype, case.row_stride,
                        describe_source(case), case.nbytes, fast_path=ok, fast_path_note=note, kind=kind)
    if read_bandwidth:
        result.floor_us = case.nbytes / read_bandwidth * 1e6
    return result


def replay_bytes(case: Case, selectors: int) -> int:
    """Device memory one case's replay takes: the original padded matrix and one copy per selector, the
    expected values, one output buffer per selector (docs/design.md)."""
    matrix = max(case.rows, 1) * case.row_stride * ELEMENT_BYTES[case.dtype]
    outputs = (case.rows + 2) * (case.top_k + 16) * 4
    return matrix * (1 + selectors) + case.rows * case.top_k * 4 + outputs * selectors


@dataclass
class _Verified:
    """A selector that passed checks 1-6: its launch, and the copy of the inputs and the output it uses."""

    result: SelectorResult
    launch: Launch
    inputs: Inputs
    output: OutputBuffer


def replay_case(case: Case, selectors: Sequence[Selector], device: torch.device, protocol: TimingProtocol,
                poison: float = 1e30, extra_checks: Sequence[ExtraCheck] = (),
                read_bandwidth: float | None = None, min_recall: float | None = None,
                determinism: int = 0) -> CaseResult:
    """Replay one case against every selector (see the module docstring); `read_bandwidth` in bytes/s;
    `min_recall` (`replay --tolerate-recall`) lets a selector whose every row reaches that recall pass
    check 3 as approximate; `determinism` (`replay --determinism N`): reruns of every verified selector
    after its timing (determinism.py)."""
    result = case_header(case, read_bandwidth)
    try:
        check_memory(f"case {case.case_id}", f"its replay ({len(selectors)} selectors)",
                     replay_bytes(case, len(selectors)), device)
    except ArchiveError as e:
        result.invalid = str(e)
        return result
    bad = nan_row(case, device)
    if bad is not None:
        result.invalid = f"NaN inside row {bad}"
        return result
    original = Inputs.of(case.padded(poison=poison, device=device), torch.from_numpy(case.row_starts).to(device),
                         torch.from_numpy(case.row_ends).to(device))
    expected = expected_values(original.logits, original.row_starts, original.row_ends, case.top_k)
    try:
        _verify_and_time(case, selectors, original, expected, device, protocol, extra_checks, result, min_recall,
                         determinism)
    except DeviceLost as lost:  # only the culprit's result stands; the caller redoes the rest elsewhere
        result.results = [lost.result] if lost.result is not None else []
        lost.partial = result
        raise
    return result


def _verify_and_time(case: Case, selectors: Sequence[Selector], original: Inputs, expected: torch.Tensor,
                     device: torch.device, protocol: TimingProtocol, extra_checks: Sequence[ExtraCheck],
                     result: CaseResult, min_recall: float | None, determinism: int) -> None:
    verified: list[_Verified] = []
    for sel in selectors:
        res, ok = _verify_selector(sel, case, original, expected, device, extra_checks, min_recall)
        result.results.append(res)
        if ok is not None:
            verified.append(ok)
    for v in verified:
        v.output.reset()  # the timed calls must write the output again: check 7 reads the last one
    timings = _time({v.result.selector: v.launch for v in verified}, device, protocol)
    for v in verified:
        timing = timings[v.result.selector]
        if not isinstance(timing, Timing):
            v.result.status, v.result.reason = "error", timing
            continue
        try:
            failures = _after_timing(v, case, original, expected, device, min_recall)
        except BaseException as e:  # an asynchronous CUDA error of the timed calls surfaces here
            v.result.status, v.result.reason = "error", f"after timing: {_plugin_error(e)}"
            raise_if_lost(device, v.result)
            continue
        if failures:
            _failed(v.result, failures)
            continue
        v.result.timing = timing
    passed = [v for v in verified if v.result.timing is not None]
    result.ties, policies = tie_report(original.logits, original.row_starts, original.row_ends, expected,
                                       {v.result.selector: v.output.view for v in passed})
    for v in passed:
        v.result.tie_policy = policies[v.result.selector]
        v.result.row_digests = row_digests(v.output.view)
    result.agreement = agreement({v.result.selector: v.result.row_digests for v in passed
                                  if v.result.row_digests is not None})
    for v in passed if determinism else []:
        try:
            v.result.determinism = rerun(v.launch, v.output, determinism, device)
        except BaseException as e:
            v.result.status, v.result.timing = "error", None
            v.result.reason = f"determinism reruns: {_plugin_error(e)}"
            raise_if_lost(device, v.result)


def _verify_selector(sel: Selector, case: Case, original: Inputs, expected: torch.Tensor, device: torch.device,
                     extra_checks: Sequence[ExtraCheck],
                     min_recall: float | None) -> tuple[SelectorResult, _Verified | None]:
    """Steps 1-4 of the module docstring for one selector; a `_Verified` when it may be timed."""
    res = SelectorResult(str(getattr(sel, "name", sel)), "ok")
    try:
        why = sel.supports(case, device)
        if why is not None and not isinstance(why, str):  # e.g. True, the natural guess: a plugin bug
            raise TypeError(f"supports() returned {why!r}; it must return None (supported) or a reason "
                            "string (unsupported)")
        if why is not None:
            res.status, res.reason = "unsupported", why
            return res, None
        inputs = original.copy()
        out = OutputBuffer(case.rows, case.top_k, device)
        launch = prepare_for(sel, case, inputs.logits, inputs.row_starts, inputs.row_ends, case.top_k, out.view)
        if not callable(launch):
            raise TypeError(f"prepare returned {type(launch).__name__}, which is not callable (a launch)")
        launch()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        failures = check_output(case, original.logits, original.row_starts, original.row_ends, out, expected,
                                min_recall)
        res.damage = _damage(failures, original, out, expected, min_recall)
        if not failures:
            prepared = Prepared(case, sel, launch, out, inputs.logits, inputs.row_starts, inputs.row_ends,
                                min_recall)
            failures = [f for check in extra_checks for f in check(prepared)]
        changed = inputs.changed(case.case_id, original)
    except BaseException as e:
        res.status, res.reason = "error", _plugin_error(e)
        raise_if_lost(device, res)
        return res, None
    failures += [changed] if changed is not None else []
    if failures:
        _failed(res, failures)
        return res, None
    if res.damage is not None:
        res.status = "approximate"
    note = getattr(sel, "note", None)  # an adapter's own line (its staging copy, the backend it chose)
    if callable(note):
        with contextlib.suppress(Exception):
            res.reason = one_line(str(note(case)), 300)
    return res, _Verified(res, launch, inputs, out)


def _after_timing(v: _Verified, case: Case, original: Inputs, expected: torch.Tensor,
                  device: torch.device, min_recall: float | None) -> list[Failure]:
    """Check 7 (the last timed call's output passes checks 1-4) and check 6 again, after timing."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    failures = [Failure(TIMED_CHECK, TIMED, f.case_id, f.row,
                        f"output of the last timed call: check {f.check} ({f.name}): {f.detail}")
                for f in check_output(case, original.logits, original.row_starts, original.row_ends, v.output,
                                      expected, min_recall)]
    changed = v.inputs.changed(case.case_id, original)
    return failures + ([changed] if changed is not None else [])


def _damage(failures: list[Failure], original: Inputs, out: OutputBuffer, expected: torch.Tensor,
            min_recall: float | None) -> Damage | None:
    """The damage of a selection whose values check 3 found wrong, or tolerated (None when exact)."""
    if min_recall is None and not any(f.check == 3 for f in failures):
        return None
    return damage_of(original.logits, original.row_starts, original.row_ends, out.view, expected)


def _failed(res: SelectorResult, failures: list[Failure]) -> None:
    res.status, res.failures, res.timing = "failed", sorted(failures, key=lambda f: f.check), None
    res.reason = f"check {res.failures[0].check} ({res.failures[0].name})"


def _time(launches: dict[str, Launch], device: torch.device,
          protocol: TimingProtocol) -> dict[str, Timing | str]:
    """Time all launches together; if that raises, time each alone so one bad launch spoils only itself."""
    if not launches:
        return {}
    try:
        return dict(time_launches(launches, device, protocol))
    except BaseException as e:
        _plugin_error(e)  # a real Ctrl-C ends the run here
        raise_if_lost(device)  # which selector broke it is found in fresh processes, one per selector
    out: dict[str, Timing | str] = {}
    for name, launch in launches.items():
        try:
            out[name] = time_launches({name: launch}, device, protocol)[name]
        except BaseException as e:
            why = f"timing raised {_plugin_error(e)}"
            out[name] = why
            raise_if_lost(device, SelectorResult(name, "error", why))
    return out


def replay(cases: Iterable[Case | Unreadable], selectors: Sequence[Selector], device: torch.device,
           protocol: TimingProtocol, poison: float = 1e30, extra_checks: Sequence[ExtraCheck] = (),
           read_bandwidth: float | None = None, min_recall: float | None = None,
           determinism: int = 0) -> Iterator[CaseResult]:
    """Replay cases one at a time (each is dropped before the next is read); `min_recall` and `determinism`
    as `replay_case` takes them."""
    with _watch_ctrl_c():
        for case in cases:
            if isinstance(case, Unreadable):
                yield CaseResult(case.case_id, 0, 0, 0, "-", 0, "unreadable", 0, invalid=case.reason)
                continue
            yield replay_case(case, selectors, device, protocol, poison, extra_checks, read_bandwidth, min_recall,
                              determinism)


__all__ = ["Unbuildable", "case_header", "device_checks", "replay", "replay_bytes", "replay_case"]
