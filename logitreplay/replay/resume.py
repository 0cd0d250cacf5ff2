"""`replay --resume R.json`: finish a replay that SIGINT or SIGTERM stopped.

An interrupted run writes the report of the cases it finished, marked partial with the signal and the
run's configuration (`ReplayResult.partial`, run.py). Resuming replays exactly the cases of that run the
report does not hold, with the same configuration, and merges them with the report's cases in the run's
order: the result is the report a run that was never stopped would have written (its cases timed in two
sittings, which a note says). Stopped again, it is partial again, holding the cases of both sittings.
"""

from __future__ import annotations

from dataclasses import replace

from logitreplay.errors import ReplayError
from logitreplay.replay.results import CaseResult, ReplayResult
from logitreplay.replay.run import (
    Progress,
    ReplayConfig,
    ReplayInterrupted,
    ReplayRun,
    _no_progress,
    case_ids,
    config_from_json,
    merge_runs,
    partial_mark,
    run_replay,
)


def plan(previous: ReplayResult, name: str = "the report") -> tuple[ReplayConfig, list[int], list[int]]:
    """The interrupted run's configuration, the places (in its run) of the cases `previous` holds, and the
    places still to replay; a one-line `ReplayError` when `previous` is not a partial report or its cases
    are not the run's any more (an archive changed since)."""
    if previous.partial is None:
        raise ReplayError(f"{name} is a complete report (not marked partial); nothing to resume")
    config = config_from_json(previous.partial.get("config") or {})
    whole = case_ids(replace(config, case_indices=None))
    place = {cid: p for p, cid in enumerate(whole)}
    foreign = [c.case_id for c in previous.cases if c.case_id not in place]
    if foreign:
        raise ReplayError(f"{name}: case {foreign[0]} is not among the run's cases any more (its archives or "
                          "suite changed since the run); replay it afresh")
    wanted = range(len(whole)) if config.case_indices is None else sorted(set(config.case_indices))
    done = {place[c.case_id] for c in finished(previous)}
    return config, sorted(done), [p for p in wanted if p not in done]


def finished(report: ReplayResult) -> list[CaseResult]:
    """The cases of `report` every selector finished (or that were invalid): a case some selector of an
    interrupted --isolate run did not reach is replayed again in full, its other results re-measured."""
    return [c for c in report.cases if c.invalid or all(c.result(s) is not None for s in report.selectors)]


def resume_replay(previous: ReplayResult, progress: Progress = _no_progress, name: str = "the report") -> ReplayRun:
    """Replay the cases the partial report `previous` lacks and merge them with its own (module docstring).
    Interrupted again, it raises `ReplayInterrupted` with the merged cases of both sittings."""
    config, done, left = plan(previous, name)
    total = len(done) + len(left)
    earlier = ReplayRun(replace(previous, partial=None, cases=finished(previous)), done, config)
    if not left:
        return earlier
    try:
        later = run_replay(replace(config, case_indices=tuple(left)), progress)
    except ReplayInterrupted as stop:
        merged = merge_runs([earlier, stop.run])
        merged.result.partial = partial_mark(stop.signal, len(merged.places), total, config)
        raise ReplayInterrupted(replace(merged, config=config), stop.signal) from None
    merged = merge_runs([earlier, later])
    merged.result.notes.append(f"resumed: {len(done)} of the {total} cases were timed before a "
                               f"{previous.partial['signal'] if previous.partial else 'signal'}, the other "
                               f"{len(left)} by the resumed run")
    return replace(merged, config=config)
