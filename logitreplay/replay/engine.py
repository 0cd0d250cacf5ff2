"""The replay engine: cases x selectors -> supports -> verify -> time, one case in memory at a time.

Per case: rebuild the padded, poisoned matrix on the device; compute the expected values once; give
every selector its own sentinel-filled output buffer; ask `supports`, `prepare`, launch once and verify
(checks 1-4, plus any device `extra_checks`, e.g. the CUDA graph replay after a bounds change). Only the
verified selectors are timed, all of a case's together, so that the timing rounds alternate A B A B and
drift spreads over all of them. A selector that raises is recorded as an error and the others go on. A
case holding a NaN inside a row is invalid input: reported, never timed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import torch

from logitreplay.archive import Case
from logitreplay.errors import one_line
from logitreplay.replay.fast_path import fast_path
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.results import CaseResult, SelectorResult
from logitreplay.replay.sources import Unreadable, describe_source
from logitreplay.replay.timing import time_launches
from logitreplay.replay.verify import (
    ExtraCheck,
    OutputBuffer,
    Prepared,
    check_output,
    expected_values,
    nan_row,
)
from logitreplay.selectors.base import Launch, Selector


def device_checks(device: torch.device) -> list[ExtraCheck]:
    """The checks a device adds to checks 1-4 (docs/design.md): on CUDA, the graph replayed after the bounds changed."""
    if device.type != "cuda":
        return []
    from logitreplay.replay.graph_check import graph_replay_check

    return [graph_replay_check]


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
            if why is not None and not isinstance(why, str):  # e.g. True, the natural guess: a plugin bug
                raise TypeError(f"supports() returned {why!r}; it must return None (supported) or a "
                                "reason string (unsupported)")
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


def replay(cases: Iterable[Case | Unreadable], selectors: Sequence[Selector], device: torch.device,
           protocol: TimingProtocol, poison: float = 1e30, extra_checks: Sequence[ExtraCheck] = (),
           read_bandwidth: float | None = None) -> Iterator[CaseResult]:
    """Replay cases one at a time (each is dropped before the next is read)."""
    for case in cases:
        if isinstance(case, Unreadable):
            yield CaseResult(case.case_id, 0, 0, 0, "-", 0, "unreadable", 0, invalid=case.reason)
            continue
        yield replay_case(case, selectors, device, protocol, poison, extra_checks, read_bandwidth)


__all__ = ["case_header", "device_checks", "replay", "replay_case"]
