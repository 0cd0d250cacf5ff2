"""The rest of a run after its CUDA context was lost (cuda_errors.DeviceLost): every selector in a fresh
child process of its own (isolate.py's machinery), from the case where the context was lost on; the
selector that lost it starts at the case after, its error already being its result there."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from logitreplay.replay.cuda_errors import DeviceLost
from logitreplay.replay.isolate import Job, merge, replay_isolated
from logitreplay.replay.results import CaseResult


def resume(jobs: list[Job], lost: DeviceLost, index: int, total: int,
           timeout_s: float) -> Iterator[tuple[str, int, CaseResult]]:
    """The rest of a run after `lost` at case `index`, one fresh child process per selector: each job from
    `index` on, except the selector that lost the context, whose case `index` is already its error."""
    culprit = lost.result.selector if lost.result is not None else None
    if lost.partial is not None and culprit is not None:
        yield culprit, index, lost.partial
    restarted = [replace(job, start=index + 1 if job.name == culprit else index) for job in jobs]
    yield from replay_isolated([j for j in restarted if j.start < total], total, timeout_s)


Progress = Callable[[Iterable[tuple[str, int, CaseResult]], int, str], Iterable[tuple[str, int, CaseResult]]]


def finish_run(done: list[CaseResult], lost: DeviceLost, jobs: list[Job], order: list[str], total: int,
               timeout_s: float, progress: Progress = lambda it, n, label: it) -> list[CaseResult]:
    """Every case of a run whose first `len(done)` cases finished in this process before `lost`: the
    rest from fresh children (`resume`), merged in column order (`order`: selector names)."""
    per_selector: dict[str, dict[int, CaseResult]] = {}
    for i, case in enumerate(done):
        for name in order:
            per_selector.setdefault(name, {})[i] = case
    rest = resume(jobs, lost, len(done), total, timeout_s)
    for name, i, case in progress(rest, (total - len(done)) * len(jobs), "replay (fresh processes)"):
        per_selector.setdefault(name, {})[i] = case
    return merge(per_selector, order, total)


__all__ = ["finish_run", "resume"]
