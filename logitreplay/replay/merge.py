"""`logitreplay merge A.json B.json ...`: one report from the reports of separate jobs (a Slurm array over
slices of the cases, one job per GPU kind), and which GPU timed each case of any report.

Reports merge only when they measured the same way: the same device kind, selectors, baseline and timing
protocol; anything else would put numbers that mean different things in one table. Their cases must
be disjoint (one case id timed twice is two measurements: `compare` them instead). The cases keep the
order of the files, then their order within each file; the runs join through `run.merge_runs`, the one
place that joins runs of disjoint subsets.

A merged report's `ranks` section names, per job (its file) and rank, the host and GPU that timed its
cases, so a report whose jobs ran on several GPU kinds still says which kind timed which case
(`case_gpus`, which `compare` uses).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from logitreplay.replay.results import ReplayResult, ReportError
from logitreplay.replay.run import ReplayConfig, ReplayRun, merge_runs


def protocol_difference(a: ReplayResult, b: ReplayResult) -> str | None:
    """None when the two timing protocols are equal, else the fields that differ (one line)."""
    x, y = a.protocol.to_json(), b.protocol.to_json()
    if x == y:
        return None
    diff = ", ".join(f"{k} {x.get(k)!r} vs {y.get(k)!r}" for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k))
    return f"the timing protocols differ ({diff})"


def _mixed(a: ReplayResult, b: ReplayResult) -> str | None:
    """Why `b` was not measured the way `a` was, or None."""
    kinds = a.device.split(":")[0], b.device.split(":")[0]
    if kinds[0] != kinds[1]:
        return f"one ran on {a.device}, the other on {b.device}"
    if a.selectors != b.selectors:
        return f"the selectors differ ({','.join(a.selectors)} vs {','.join(b.selectors)})"
    if a.baseline != b.baseline:
        return f"the baselines differ ({a.baseline} vs {b.baseline})"
    return protocol_difference(a, b)


def _ranks_of(name: str, report: ReplayResult) -> list[dict[str, Any]]:
    """A report's ranks, each naming the report it came from; a single-process report is one rank, of the
    host its environment names (null for a report that did not record it)."""
    if report.ranks:
        return [{**r, "job": name} for r in report.ranks]
    gpu = report.environment.get("gpu") if report.device.startswith("cuda") else None
    return [{"rank": 0, "host": report.environment.get("host") or None, "device": report.device, "gpu": gpu,
             "cases": [c.case_id for c in report.cases], "lost": [], "job": name}]


def merge_reports(reports: Sequence[tuple[str, ReplayResult]]) -> ReplayResult:
    """One report from (name, report) pairs of one protocol and disjoint cases (module docstring); raises a
    one-line `ReportError` naming the two reports that do not merge."""
    if not reports:
        raise ReportError("no reports to merge")
    first_name, first = reports[0]
    seen: dict[str, str] = {}
    for name, report in reports:
        why = _mixed(first, report)
        if why is not None:
            raise ReportError(f"{first_name} and {name} do not merge: {why}")
        for case in report.cases:
            if case.case_id in seen:
                raise ReportError(f"case {case.case_id} is in both {seen[case.case_id]} and {name}; merge reports "
                                  "of disjoint cases (`logitreplay compare` compares two runs of one case)")
            seen[case.case_id] = name
    runs, at = [], 0
    for _, report in reports:
        runs.append(ReplayRun(report, list(range(at, at + len(report.cases))), ReplayConfig(),
                              [str(i) for i in report.environment.get("inputs", [])]))
        at += len(report.cases)
    run = merge_runs(runs)
    merged = run.result
    merged.environment = {**merged.environment, "inputs": run.inputs}
    merged.ranks = [r for name, report in reports for r in _ranks_of(name, report)]
    if any(report.recommendation or report.per_forward for _, report in reports):
        merged.notes.append("merge: --recommend and --per-forward results of the jobs are not merged; run "
                            "`replay --recommend` or `--per-forward` over all the cases")
    merged.recommendation, merged.per_forward = [], []
    return merged


def case_gpus(report: ReplayResult) -> dict[str, str | None]:
    """The GPU that timed each case (its rank's, where the report has ranks; else the report's GPU),
    None on CPU."""
    gpu = report.environment.get("gpu") if report.device.startswith("cuda") else None
    out: dict[str, str | None] = {c.case_id: gpu for c in report.cases}
    for rank in report.ranks:
        out.update({cid: rank.get("gpu") for cid in rank.get("cases", [])})
    return out


def differences(a: ReplayResult, b: ReplayResult) -> list[str]:
    """How report `b` differs from `a` in anything but its timings (samples, read floors, the clock at the
    end) and its ranks: the run's device, protocol, selectors, baseline and notes, and case for case (in
    order) the shape, source, validity and each selector's status, reason and failed checks. Empty when a
    replay over ranks, or a merge, gave the single-process report."""
    out = [f"{name}: {x!r} vs {y!r}" for name, x, y in (
        ("device", a.device, b.device), ("clock_label", a.clock_label, b.clock_label),
        ("protocol", a.protocol, b.protocol), ("selectors", a.selectors, b.selectors),
        ("baseline", a.baseline, b.baseline), ("notes", a.notes, b.notes),
        ("cases", [c.case_id for c in a.cases], [c.case_id for c in b.cases])) if x != y]
    for x, y in zip(a.cases, b.cases, strict=False):
        keys = [f.name for f in dataclasses.fields(x) if f.name not in ("floor_us", "results")]
        out += [f"case {x.case_id}: {k} {getattr(x, k)!r} vs {getattr(y, k)!r}" for k in keys
                if getattr(x, k) != getattr(y, k)]
        seen = [(r.selector, r.status, r.reason, r.failures, r.timing is None) for r in x.results]
        other = [(r.selector, r.status, r.reason, r.failures, r.timing is None) for r in y.results]
        if seen != other:
            out.append(f"case {x.case_id}: results {seen!r} vs {other!r}")
    return out


__all__ = ["case_gpus", "differences", "merge_reports", "protocol_difference"]
