"""`replay --isolate`: every selector runs in a child process of its own, so a selector that hangs, kills
its process, or breaks the CUDA context (an illegal memory access poisons the whole context) loses only
its own results for the case where it happened; the other selectors, and its later cases, still run.

The parent starts one child per selector with a JSON job on stdin. The child replays the cases in order
and writes one line per case to stdout (`@case` before it starts one, `@result` when done). When a line
does not come within the per-case timeout, or the child dies, the parent records an error for that
(case, selector) and starts a new child at the next case. Timing rounds alternate only within one
selector here (each child times its selector alone), which the report notes.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import IO, Any

from logitreplay.errors import ReplayError, SelectorError
from logitreplay.replay.protocol import TimingProtocol
from logitreplay.replay.results import CaseResult, SelectorResult
from logitreplay.selectors.base import Selector

_READY, _CASE, _RESULT = "@ready", "@case ", "@result "
# Seconds a child may take to start (import torch, build its selector) and to read its next case: the
# per-case `--timeout` counts only the selector's own time (verify + time), from `@case` to `@result`.
STARTUP_S = 600.0


@dataclass(frozen=True)
class Job:
    """What a child needs to rebuild the run: the same cases, one selector (its spec, and the name its
    column has), the same protocol."""

    selector: str
    name: str
    locations: list[str]
    suite: str | None
    scale: str
    device: str
    protocol: dict[str, Any]
    poison: float
    read_bandwidth: float | None
    start: int = 0
    controls: tuple[str, ...] = ()  # `replay --controls`: derived cases follow each case
    case_globs: tuple[str, ...] = ()  # `replay --case`, `--match`: the same cases as the parent
    case_regex: str | None = None
    only: tuple[int, ...] | None = None  # `ReplayConfig.case_indices`: the same subset as the parent


def replay_isolated(jobs: list[Job], total: int, timeout_s: float) -> Iterator[tuple[str, int, CaseResult]]:
    """Run each job (one selector) in children; yields (selector name, case index, result) as they come."""
    for job in jobs:
        start = job.start
        while start < total:
            before = start
            for index, result in _run_child(replace(job, start=start), timeout_s):
                yield job.name, index, result
                start = index + 1
            if start == before:
                raise ReplayError(f"isolated child for {job.name!r} ended without a result at case {start}")


def merge(per_selector: dict[str, dict[int, CaseResult]], order: list[str], total: int) -> list[CaseResult]:
    """One CaseResult per case with the selectors' results in column order (`order`: selector names)."""
    merged = []
    for i in range(total):
        parts = [per_selector[s][i] for s in order if i in per_selector.get(s, {})]
        base = next((p for p in parts if p.results or p.invalid), parts[0])
        case = replace(base, results=[])
        if not case.invalid:
            case.results = [r for s in order if i in per_selector.get(s, {})
                            for r in per_selector[s][i].results if r.selector == s]
        merged.append(case)
    return merged


def _run_child(job: Job, timeout_s: float) -> Iterator[tuple[int, CaseResult]]:
    cmd = [sys.executable, "-m", "logitreplay.replay.isolate"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(json.dumps(asdict(job)))
    proc.stdin.close()
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    stderr_tail: list[str] = []
    threading.Thread(target=_tail, args=(proc.stderr, stderr_tail), daemon=True).start()
    try:
        yield from _results(proc, job, lines, stderr_tail, timeout_s)
    finally:  # also on Ctrl-C in the parent: no child outlives the run
        if proc.poll() is None:
            _kill(proc)


def _results(proc: subprocess.Popen[str], job: Job, lines: queue.Queue[str | None], stderr_tail: list[str],
             timeout_s: float) -> Iterator[tuple[int, CaseResult]]:
    current: CaseResult | None = None
    index, yielded = job.start, False
    while True:
        try:  # start-up and reading the next case are the child's own business, not the selector's
            line = lines.get(timeout=timeout_s if current is not None else max(STARTUP_S, timeout_s))
        except queue.Empty:
            _kill(proc)
            if current is None:
                raise ReplayError(f"isolated child for {job.selector!r} did not start or read case {index} "
                                  f"within {max(STARTUP_S, timeout_s):g} s") from None
            yield index, _errored(current, job.name, f"timed out after {timeout_s:g} s (child killed)")
            return
        if line is None:  # the child's stdout closed: it finished or died
            code = proc.wait()
            if current is not None:
                why = _death(code, stderr_tail)
                yield index, _errored(current, job.name, f"child process died: {why}")
            elif code != 0 and not yielded:
                raise ReplayError(f"isolated child for {job.selector!r} failed before its first case: "
                                  f"{_death(code, stderr_tail)}")
            return
        if line == _READY:
            continue
        if line.startswith(_CASE):
            payload = json.loads(line[len(_CASE):])
            index, current = payload["index"], CaseResult.from_json(payload["case"])
        elif line.startswith(_RESULT):
            payload = json.loads(line[len(_RESULT):])
            yield payload["index"], CaseResult.from_json(payload["case"])
            current, yielded = None, True


def _pump(stream: IO[str], out: queue.Queue[str | None]) -> None:
    for line in stream:
        if line.startswith((_READY, _CASE, _RESULT)):  # anything else is a plugin's own printing
            out.put(line.rstrip("\n"))
    out.put(None)


def _tail(stream: IO[str], tail: list[str]) -> None:
    for line in stream:
        if line.strip():
            tail[:] = (tail + [line.strip()])[-3:]


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _death(code: int, stderr_tail: list[str]) -> str:
    what = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    return what + (f" ({stderr_tail[-1][:200]})" if stderr_tail else "")


def _errored(case: CaseResult, selector: str, reason: str) -> CaseResult:
    case.results = [SelectorResult(selector, "error", reason)]
    return case


def _child() -> None:
    """Child side: replay the job's cases with its one selector, reporting each case as it goes."""
    import torch

    from logitreplay.archive import Case
    from logitreplay.replay.cuda_errors import DeviceLost
    from logitreplay.replay.engine import Unbuildable, case_header, device_checks, replay
    from logitreplay.replay.sources import open_cases
    from logitreplay.selectors.registry import build

    job = Job(**json.loads(sys.stdin.read()))
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # a plugin's prints go to stderr, never into the result stream
    device = torch.device(job.device)
    extra = device_checks(device)
    try:
        selector: Selector = build(job.selector)
    except (SelectorError, SystemExit) as e:  # the factory's failure is this selector's result on every case
        selector = Unbuildable(job.name, str(e))
    out.write(_READY + "\n")
    cases, _, _ = open_cases(job.locations, job.suite, job.scale, start=job.start, controls=job.controls,
                             case_globs=job.case_globs, case_regex=job.case_regex, only=job.only)
    protocol = TimingProtocol(**job.protocol)
    for index, case in enumerate(cases, start=job.start):
        if isinstance(case, Case):
            header = case_header(case, job.read_bandwidth)
            out.write(_CASE + json.dumps({"index": index, "case": header.to_json()}) + "\n")
        try:
            result = next(replay([case], [selector], device, protocol, job.poison, extra, job.read_bandwidth))
        except DeviceLost as lost:  # this process can do no more GPU work: the parent starts a fresh child
            if lost.partial is None:  # the engine sets it on every DeviceLost it raises
                raise
            result = lost.partial
            result.results = result.results or [SelectorResult(job.name, "error", str(lost)[:300])]
            out.write(_RESULT + json.dumps({"index": index, "case": result.to_json()}) + "\n")
            break
        out.write(_RESULT + json.dumps({"index": index, "case": result.to_json()}) + "\n")


if __name__ == "__main__":
    _child()
