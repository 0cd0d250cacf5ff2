"""Workers: the replay runs in child processes that the parent supervises, so nothing a selector does
(`os._exit`, a segfault, the OOM killer, a CUDA abort or lost context, a hang past `--timeout`) takes
the run down: the parent owns the report and the exit status.

A job is the selectors one worker replays: all of them (the default; timing rounds alternate across
them exactly as in one process) or one (`--isolate`, `--timeout`, two builds of one kernel library).
The worker replays the job's cases in order and sends, per case, `case` (its header) before any
selector runs on it, `step` (the selectors about to run) and `result`.

When a worker ends early, the parent knows the case and the step in progress. A step of one selector
ends that selector's result on that case with the reason ("worker died: SIGSEGV", "timed out after 5 s
(worker killed)"); a step of several is run again in a fresh worker one selector at a time, which finds
the one; a worker that reports a lost CUDA context (cuda_errors.py) has sent its culprit's result
itself; a death while reading a case makes that case invalid. Memory that runs out after other selectors'
code ran in the worker may be another selector's doing (one that hoards what it took): the worker ends
itself without a result for that step ("spent"), and fresh workers run the step's selectors one at a
time, so that only the one that runs out of memory in a process of its own has that error. A fresh worker then continues from that
case with the selectors whose result there is not yet known. Every fresh worker so starts further on
(a later case, or more results known on its case, or its selectors one at a time), and a worker that
ends twice on one case with nothing new settled (outside any selector's step) ends the unknown results
there: no case can restart workers without end.

A worker that has sent its last message is given EXIT_S to end and is then killed, so a thread or an
exit handler that never returns (one left waiting on a lost CUDA context) cannot hold the run. A killed
worker that still does not end within KILL_S is stuck in an uninterruptible system call (a device
driver's, say): it is left behind, with a note or in its selector's reason, and the run goes on in a
fresh worker, so the report is still written and the run still ends.

Workers are forked from multiprocessing's fork server, which imports torch and the engine once per run
(started when the run starts, so that its imports overlap the parent's set-up) and never starts CUDA or
a thread pool: a worker then starts in milliseconds. A fork of the parent itself would inherit its CUDA
context and OpenMP pool, which fail or hang in a child (a team of threads that no longer exists). The
worker takes the parent's working directory, environment, import path and thread count, and dies with
its parent.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import sys
import tempfile
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from logitreplay.errors import ReplayError, one_line
from logitreplay.replay.protocol import TimingProtocol
from logitreplay.replay.results import CaseResult, SelectorResult
from logitreplay.replay.ties import agreement

# Seconds a worker may take to start (the fork server's first import of torch) and to read its next
# case: a `--timeout` counts only the selectors' own time on a case, from `step` to `result`.
STARTUP_S = 600.0
# Seconds a worker that sent its last message, or whose pipe closed, may take to end by itself.
EXIT_S = 10.0
# Seconds a worker may take to end once killed (SIGKILL); past them it is stuck in a system call.
KILL_S = 60.0
# The processes multiprocessing's exit handler joins, without a timeout, when the interpreter ends (its own
# module-level set: no public call drops a process that cannot end).
_CHILDREN: set[Any] = multiprocessing.process._children  # type: ignore[attr-defined]
# What the fork server imports once, so that no worker imports it again.
PRELOAD = ["torch", "logitreplay.archive", "logitreplay.replay.engine", "logitreplay.replay.sources",
           "logitreplay.selectors.registry", "logitreplay.selectors.bundled"]


@dataclass(frozen=True)
class Job:
    """What a worker needs to rebuild its part of the run: the same cases, its selectors (specs, and the
    names their columns have), the same protocol; where to start, and which selectors' results on that
    first case are already known (`known`: not run there again) or must be found one at a time
    (`one_by_one`)."""

    specs: tuple[str, ...]
    names: tuple[str, ...]
    locations: list[str]
    suite: str | None
    scale: str
    device: str
    protocol: dict[str, Any]
    poison: float
    read_bandwidth: float | None
    controls: tuple[str, ...] = ()  # `replay --controls`: derived cases follow each case
    case_globs: tuple[str, ...] = ()  # `replay --case`, `--match`: the same cases as the parent
    case_regex: str | None = None
    only: tuple[int, ...] | None = None  # `ReplayConfig.case_indices`: the same subset as the parent
    min_recall: float | None = None  # `replay --tolerate-recall`
    determinism: int = 0  # `replay --determinism N`
    start: int = 0
    known: tuple[str, ...] = ()
    one_by_one: bool = False
    context: dict[str, Any] = field(default_factory=dict)  # the parent's cwd, environment, sys.path, threads


@dataclass(frozen=True)
class _End:
    """How a worker ended before its last case: in case `index` (`started`: its header was sent), in
    `step` (the selectors running; None between them), why; `lost`: it reported a lost CUDA context,
    `culprit` the selector whose result it sent for that (None: the timing of several lost it)."""

    index: int
    started: bool
    step: tuple[str, ...] | None
    reason: str
    lost: bool = False
    culprit: str | None = None
    spent: bool = False  # it ran out of memory after other selectors' code ran in it (`_out_of_memory`)


def supervise(job: Job, total: int, timeout_s: float | None, notes: list[str],
              ids: Sequence[str] = ()) -> Iterator[tuple[int, CaseResult]]:
    """Every case of `job` from its start as (case index, result of the job's selectors), each once all
    of them are known; a worker that ends early is replaced as the module docstring says, with a note.
    `ids`: the case id at each index (from the metadata), to name a case no worker could read."""
    headers: dict[int, CaseResult] = {}
    parts: dict[int, dict[str, SelectorResult]] = {}  # every result on each case so far, from every worker
    done: set[int] = set()  # the cases yielded
    stalled: dict[int, tuple[tuple[str, ...], bool]] = {}  # per case: what was known when an end settled nothing
    job = replace(job, context=job.context or _context())
    while job.start < total:
        worker = _run_worker(job, timeout_s, notes)
        while True:
            try:
                kind, index, case = next(worker)
            except StopIteration as stop:
                end: _End | None = stop.value
                break
            headers.setdefault(index, replace(case, results=[]))
            if kind == "result":
                parts.setdefault(index, {}).update({r.selector: r for r in case.results})
                if index not in done and (case.invalid or set(job.names) <= set(parts[index])):
                    done.add(index)
                    yield index, _whole(case, parts[index], job.names)
        if end is None:
            return
        job = _after(job, end, total, headers, parts, stalled, notes, ids)
        i = end.index
        if i not in done and i in headers and (headers[i].invalid or set(job.names) <= set(parts.get(i, {}))):
            done.add(i)
            yield i, _whole(headers[i], parts.get(i, {}), job.names)


def _after(job: Job, end: _End, total: int, headers: dict[int, CaseResult],
           parts: dict[int, dict[str, SelectorResult]], stalled: dict[int, tuple[tuple[str, ...], bool]],
           notes: list[str], ids: Sequence[str] = ()) -> Job:
    """The job of the next worker after `end`, recording the result it settles; never `job` itself twice
    in a row for one case more than once (`stalled`: per case, what was known there when an end settled
    nothing, so that a second such end gives up on it)."""
    i = end.index
    if i >= total:  # it ended after its last result, before saying it was done: nothing is left to run
        return replace(job, start=i, known=(), one_by_one=False)
    if end.spent:  # nothing is blamed: a fresh worker goes on, a step of several one selector at a time
        known = tuple(n for n in job.names if n in parts.get(i, {}))
        cid = headers[i].case_id if i in headers else (ids[i] if i < len(ids) else f"#{i}")
        if not any(n.startswith("memory ran out") for n in notes):  # once a run: it may recur on every case
            notes.append(f"memory ran out in a worker other selectors' code had run in (first on case {cid}: "
                         f"{one_line(end.reason, 120)}); fresh workers went on, one selector at a time")
        if i in headers and len(known) == len(job.names):
            return replace(job, start=i + 1, known=(), one_by_one=False)
        several = end.step is not None and len(end.step) > 1
        return replace(job, start=i, known=known, one_by_one=several or (job.one_by_one and i == job.start))
    if not end.started or i not in headers:  # it died reading the case: unusable, the run goes on after it
        cid = ids[i] if i < len(ids) else f"#{i}"
        headers[i] = CaseResult(cid, 0, 0, 0, "-", 0, "unreadable", 0,
                                invalid=f"the worker died while reading this case: {end.reason}")
        notes.append(f"case {cid} could not be read: {end.reason}")
        return replace(job, start=i + 1, known=(), one_by_one=False)
    have = parts.setdefault(i, {})  # every result on case i so far, from this worker and the ones before
    unresolved = [n for n in end.step or () if n not in have]
    one_by_one = job.one_by_one and i == job.start
    culprit = end.culprit if end.lost else None  # a lost context's culprit has sent its error itself
    if culprit is None and len(unresolved) == 1:
        culprit = unresolved[0]
        have[culprit] = SelectorResult(culprit, "error", end.reason)
    elif culprit is None and unresolved:  # one of several ended it: run them one at a time to find which
        one_by_one = True
    if culprit is not None:
        notes.append(f"{culprit} on case {headers[i].case_id}: {end.reason}; a fresh worker continued the run "
                     "from there")
    known = tuple(n for n in job.names if n in have)
    # An end that settles nothing on its case (a death between steps, of no selector's doing; before it the
    # worker knew the job's results there, or none on a later case) is tried once more in a fresh worker;
    # a second such end on that case ends its unknown results.
    before = (job.known, job.one_by_one) if i == job.start else ((), False)
    if len(known) < len(job.names) and (known, one_by_one) == before:
        if stalled.get(i) != before:
            stalled[i] = before
        else:
            for name in job.names:
                have.setdefault(name, SelectorResult(name, "error", f"{end.reason} (twice, between steps)"))
            notes.append(f"case {headers[i].case_id}: two workers ended there between steps ({end.reason}); "
                         "the run went on after it")
            known = job.names
    if len(known) == len(job.names):
        return replace(job, start=i + 1, known=(), one_by_one=False)
    return replace(job, start=i, known=known, one_by_one=one_by_one)


def _whole(header: CaseResult, results: dict[str, SelectorResult], names: tuple[str, ...]) -> CaseResult:
    return replace(header, results=[] if header.invalid else [results[n] for n in names if n in results])


def merge(per_selector: dict[str, dict[int, CaseResult]], order: list[str], total: int,
          indices: Iterable[int] | None = None) -> list[CaseResult]:
    """One CaseResult per case (every one of `total`, or those at `indices`) with the selectors' results in
    column order (`order`: selector names), and the agreement of their index sets (ties.py), which
    selectors replayed in different processes can only have here."""
    merged = []
    for i in range(total) if indices is None else indices:
        parts = [per_selector[s][i] for s in order if i in per_selector.get(s, {})]
        base = next((p for p in parts if p.results or p.invalid), parts[0])
        case = replace(base, results=[])
        if not case.invalid:
            case.results = [r for s in order if i in per_selector.get(s, {})
                            for r in per_selector[s][i].results if r.selector == s]
            case.agreement = agreement({r.selector: r.row_digests for r in case.results if r.row_digests is not None})
            for r in case.results:
                r.row_digests = None  # found: not kept for the rest of the run
        merged.append(case)
    return merged


def start_server() -> None:
    """Start the fork server now (it imports torch once), so that its start-up overlaps the parent's."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)
    from multiprocessing import forkserver

    forkserver.ensure_running()


def _context() -> dict[str, Any]:
    import torch

    return {"cwd": os.getcwd(), "env": dict(os.environ), "sys_path": list(sys.path),
            "threads": torch.get_num_threads()}


def _run_worker(job: Job, timeout_s: float | None,
                notes: list[str]) -> Generator[tuple[str, int, CaseResult], None, _End | None]:
    """One worker over `job`: yields ("case" | "result", index, CaseResult) as they come; returns None
    when it replayed every case (noting a worker left behind), else how it ended."""
    start_server()
    ctx = multiprocessing.get_context("forkserver")
    with tempfile.NamedTemporaryFile(prefix="logitreplay-worker-", suffix=".log", delete=False) as log:
        pass
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_work, args=(job, writer, log.name))
    proc.start()
    writer.close()
    index, started, step, ready = job.start, False, None, False
    try:
        while True:
            limit = (timeout_s if step is not None else STARTUP_S)
            if not wait([reader, proc.sentinel], limit):
                left = _kill(proc)
                if step is None:
                    raise ReplayError(f"a worker for {', '.join(job.names)} did not start or read case {index} "
                                      f"within {STARTUP_S:g} s{left}")
                return _End(index, started, step, f"timed out after {timeout_s:g} s (worker killed){left}")
            try:
                message = reader.recv() if reader.poll() else None
            except EOFError:
                message = None
            if message is None:  # it ended without saying it was done
                proc.join(EXIT_S)
                lingered = proc.exitcode is None
                left = _kill(proc)
                why = (f"worker closed its pipe but did not exit within {EXIT_S:g} s (killed){left}" if lingered
                       else f"worker died: {_death(proc.exitcode, log.name)}")
                if not ready:
                    raise ReplayError(f"a worker for {', '.join(job.names)} failed before its first case: {why}")
                return _End(index, started, step, why)
            kind = message[0]
            if kind == "ready":
                ready = True
            elif kind == "case":
                index, started, step = message[1], True, None
                yield "case", index, message[2]
            elif kind == "step":
                index, started, step = message[1], True, message[2]
            elif kind == "result":  # message[3]: the case's last step
                yield "result", message[1], message[2]
                index, started, step = (message[1] + 1, False, None) if message[3] else (message[1], True, None)
            elif kind == "lost":  # the engine sets the partial result (the culprit's error) on every DeviceLost
                if message[2] is not None:
                    yield "result", message[1], message[2]
                return _End(index, started, step, message[3], lost=True, culprit=message[4])
            elif kind == "spent":
                return _End(message[1], True, message[2], message[3], spent=True)
            elif kind == "done":
                proc.join(EXIT_S)
                left = _kill(proc)
                if left:
                    notes.append(f"a worker for {', '.join(job.names)} did not end after its last case{left}")
                return None
    finally:  # also on Ctrl-C in the parent: no worker outlives the run
        reader.close()
        with contextlib.suppress(OSError):
            os.unlink(log.name)
        if proc in _CHILDREN:  # not yet ended, nor left behind by _kill
            _kill(proc)


def _kill(proc: multiprocessing.process.BaseProcess) -> str:
    """SIGKILL `proc` and its process group unless it has ended; "" once it has ended, else (not ended
    within KILL_S: stuck in an uninterruptible system call) the words that say it was left behind. A
    process left behind is dropped from multiprocessing's children, whose exit handler would otherwise
    wait on it for ever when the run ends."""
    if proc.pid is not None and proc.exitcode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its own process group
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    proc.join(KILL_S)
    if proc.exitcode is not None:
        return ""
    _CHILDREN.discard(proc)
    return (f"; worker process {proc.pid} did not end within {KILL_S:g} s of SIGKILL: left behind, stuck in an "
            "uninterruptible system call such as a device driver's (the GPU may need a reset)")


def _death(code: int | None, log: str) -> str:
    """`exit status 0`, `SIGSEGV`, `SIGKILL (out of memory?)`, with the worker's last line of output."""
    if code is not None and code < 0:
        what = signal.Signals(-code).name + (" (out of memory?)" if -code == signal.SIGKILL else "")
    else:
        what = f"exit status {code}"
    try:
        with open(log, errors="replace") as f:
            lines = [line.strip() for line in f.read()[-4000:].splitlines() if line.strip()]
    except OSError:
        lines = []
    return what + (f" ({one_line(lines[-1], 200)})" if lines else "")


def _die_with_parent() -> None:
    """SIGKILL this worker when the process that forked it (the fork server, which ends with the run)
    ends, so that no worker outlives a run that was itself killed (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _work(job: Job, out: Connection, log: str) -> None:
    """Worker side: replay the job's cases with its selectors, reporting each step as it goes."""
    os.setsid()  # its own process group, out of reach of the terminal's Ctrl-C (the parent handles that)
    _die_with_parent()
    os.chdir(job.context["cwd"])
    os.environ.clear()
    os.environ.update(job.context["env"])
    sys.path[:] = job.context["sys_path"]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)  # a plugin's prints, and a dying worker's last words, go to the log
    os.dup2(fd, 2)
    sys.stdout = sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115 (no lock a parent's thread held)
    # Locks made here (zarr's codecs make one) are this process's own: as in a forked process, their
    # names are unlinked at once, so a worker that dies leaves none for the parent's resource tracker.
    multiprocessing.set_start_method("fork", force=True)
    import torch

    from logitreplay.archive import Case
    from logitreplay.errors import SelectorError
    from logitreplay.replay.cuda_errors import DeviceLost
    from logitreplay.replay.engine import Unbuildable, case_header, device_checks, replay
    from logitreplay.replay.sources import open_cases
    from logitreplay.selectors.base import Selector
    from logitreplay.selectors.registry import build

    torch.set_num_threads(job.context["threads"])
    device = torch.device(job.device)
    selectors: list[Selector] = []
    for spec, name in zip(job.specs, job.names, strict=True):
        try:
            selectors.append(build(spec))
        except (SelectorError, SystemExit) as e:  # the factory's failure is this selector's result everywhere
            selectors.append(Unbuildable(name, str(e)))
    out.send(("ready",))
    extra = device_checks(device)
    protocol = TimingProtocol(**job.protocol)
    cases, _, _ = open_cases(job.locations, job.suite, job.scale, start=job.start, controls=job.controls,
                             case_globs=job.case_globs, case_regex=job.case_regex, only=job.only)
    steps = 0  # steps run in this process: after one, running out of memory may be an earlier selector's doing
    for index, case in enumerate(cases, start=job.start):
        first = index == job.start
        here = [s for s in selectors if not (first and s.name in job.known)]
        if not isinstance(case, Case) and steps and _out_of_memory(case.reason):
            out.send(("spent", index, None, case.reason))  # a fresh worker reads it
            return
        if isinstance(case, Case):
            out.send(("case", index, case_header(case, job.read_bandwidth)))
        groups = [[s] for s in here] if first and job.one_by_one and isinstance(case, Case) else [here]
        for n, group in enumerate(groups, start=1):
            names = tuple(s.name for s in group)
            out.send(("step", index, names))
            try:
                result = next(replay([case], group, device, protocol, job.poison, extra, job.read_bandwidth,
                                     job.min_recall, job.determinism))
            except DeviceLost as lost:  # this process can do no more GPU work: a fresh worker goes on
                out.send(("lost", index, lost.partial, str(lost), lost.result.selector if lost.result else None))
                return
            steps += 1
            short = next((why for why in [result.invalid, *(r.reason for r in result.results)] if _out_of_memory(why)),
                         None)
            if short is not None and (steps > 1 or len(group) > 1):
                out.send(("spent", index, names, short))  # whose doing is unknown: none of these results is kept
                return
            out.send(("result", index, result, n == len(groups)))
            if short is not None:  # its own: the process may still hold what it took
                out.send(("spent", index + (n == len(groups)), None, short))
                return
    out.send(("done",))


def _out_of_memory(reason: str | None) -> bool:
    """Whether a reason says host or device memory ran out (Python's, torch's and check_memory's words)."""
    return reason is not None and re.search(
        r"MemoryError|out of (host |device )?memory|allocate memory|GiB available on", reason) is not None
