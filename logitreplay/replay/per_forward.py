"""`replay --per-forward`: what a selector costs per forward pass, from the capture's call records.

A replayed case is one top-k call; serving pays for every call of a forward (each layer, each width of a
chunked prefill). The capture records every call it saw, stored or not (`archive/calls.py`). Here each
call is stood for by a stored case of the same layer, the one nearest in width, and a selector's time per
forward is the sum over the forward's calls of count x that case's median. Its share is that time over
the forward's recorded time (mean over forwards: both sums are per forward, so the share is one ratio
of means). Calls of a layer with no replayed case are uncovered and listed, never guessed; an archive
without call records (a synthetic suite, an import, an older capture) is reported as having none.

The estimate assumes a call costs what the nearest stored case of its layer costs; `exact_width_calls`
says how many calls had a case of exactly their width, and the rows of a call may differ from its case's.

A share compares the replay's times with the capture's forward, so it is given only where both ran on
the same kind of device (a forward timed by CUDA events against a CUDA replay, a wall-clock forward of a
CPU run against a CPU replay); otherwise `share_note` says why there is none. A share above 100% is
possible, and means what it says: the selector's calls take longer than the whole recorded forward
took (the CPU models of the bundled kernels are much slower than the top-k a CPU forward runs).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from logitreplay.archive import Archive
from logitreplay.archive.calls import CallCount, read_calls
from logitreplay.replay.results import CaseResult, ReplayResult


@dataclass
class SelectorTotal:
    """One selector on one archive: mean top-k microseconds per forward and its share of the forward
    (None where some covered call's case has no time for this selector: `untimed_calls` counts them)."""

    selector: str
    topk_us_per_forward: float | None
    share_of_forward: float | None
    untimed_calls: int = 0


@dataclass
class ArchiveForwards:
    """The per-forward totals of one archive, or why there are none (`no_records`)."""

    location: str
    cases: int
    no_records: str | None = None
    forwards: int = 0
    calls: int = 0
    covered_calls: int = 0
    exact_width_calls: int = 0
    forward_us: float | None = None  # mean recorded time of a forward (None: the engine gave none)
    timer: str | None = None
    share_note: str | None = None  # why the totals have no share of the forward
    totals: list[SelectorTotal] = field(default_factory=list)
    uncovered: list[dict[str, Any]] = field(default_factory=list)  # (layer, width, rows, dtype, kind) + calls
    stood_for: dict[str, int] = field(default_factory=dict)  # case id -> calls it stands for

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def per_forward(result: ReplayResult, archives: Sequence[Archive]) -> list[ArchiveForwards]:
    """Totals for each archive replayed (see the module docstring)."""
    by_id = {c.case_id: c for c in result.cases if not c.invalid}
    return [_archive_forwards(result, archive, by_id) for archive in archives]


def _archive_forwards(result: ReplayResult, archive: Archive, by_id: dict[str, CaseResult]) -> ArchiveForwards:
    layers: dict[int, list[CaseResult]] = {}
    n_cases = 0
    for info in archive.infos():
        case = by_id.get(info.case_id)
        if case is None:
            continue
        n_cases += 1
        layer = info.provenance.get("layer_index")
        if isinstance(layer, int):
            layers.setdefault(layer, []).append(case)
    out = ArchiveForwards(archive.location, n_cases)
    records = read_calls(archive)
    forwards = [f for r in records for f in r.forwards]
    if not forwards:
        source = {str(i.provenance.get("source", "")) for i in archive.infos()}
        out.no_records = ("no call records (" + (", ".join(sorted(s for s in source if s)) or "not a capture")
                          + "): per-forward totals need a capture that recorded its calls")
        return out
    out.forwards, out.timer = len(forwards), records[0].timer
    walls = [f.wall_us for f in forwards if f.wall_us is not None]
    out.forward_us = sum(walls) / len(walls) if len(walls) == len(forwards) else None
    sums = dict.fromkeys(result.selectors, 0.0)
    untimed: Counter[str] = Counter()
    uncovered: Counter[tuple[int, int, int, str | None, str]] = Counter()
    stood_for: Counter[str] = Counter()
    for forward in forwards:
        for call in forward.calls:
            out.calls += call.count
            case = _nearest(layers.get(call.layer, []), call)
            if case is None:
                uncovered[(call.layer, call.width, call.rows, call.dtype, call.kind)] += call.count
                continue
            out.covered_calls += call.count
            out.exact_width_calls += call.count if case.cols == call.width else 0
            stood_for[case.case_id] += call.count
            for selector in result.selectors:
                timing = case.timed(selector)
                if timing is None:
                    untimed[selector] += call.count
                else:
                    sums[selector] += call.count * timing.median_us
    out.share_note = _no_share(out.timer, result.device) if out.forward_us else None
    for selector in result.selectors:
        per = None if untimed[selector] else sums[selector] / len(forwards)
        share = None if per is None or not out.forward_us or out.share_note else per / out.forward_us
        out.totals.append(SelectorTotal(selector, per, share, untimed[selector]))
    out.uncovered = [{"layer": k[0], "width": k[1], "rows": k[2], "dtype": k[3], "kind": k[4], "calls": n}
                     for k, n in sorted(uncovered.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))]
    out.stood_for = dict(stood_for)
    return out


def _no_share(timer: str | None, device: str) -> str | None:
    """Why a forward timed by `timer` cannot be set against a replay on `device`, or None when it can."""
    forward_on_gpu, replay_on_gpu = timer == "cuda-events", device.split(":")[0] == "cuda"
    if forward_on_gpu == replay_on_gpu:
        return None
    return (f"the forward was timed on a GPU ({timer}), this replay ran on {device}: no share of the forward"
            if forward_on_gpu else f"the forward was timed on a CPU ({timer}), this replay ran on {device}: no "
            "share of the forward")


def _nearest(cases: list[CaseResult], call: CallCount) -> CaseResult | None:
    """The case of the call's layer nearest in width (the narrower one on a tie)."""
    return min(cases, key=lambda c: (abs(c.cols - call.width), c.cols), default=None)


__all__ = ["ArchiveForwards", "SelectorTotal", "per_forward"]
