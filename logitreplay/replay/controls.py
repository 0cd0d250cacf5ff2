"""`replay --controls`: each real case next to its derived controls, and real / matched per selector.

The derived cases (`datasets/controls.py`) replay like any case, verified and timed; this groups their
results back under the case they came from. real / matched below 1 means the selector is faster on the
real logits than on normal random data of the same shape (random data overstates its time); above 1,
random data flatters it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from logitreplay.datasets.controls import split_id
from logitreplay.replay.results import CaseResult, ReplayResult


@dataclass
class ControlRow:
    """One real case and one selector: its median time, each control's, and real / matched."""

    case_id: str
    source: str
    selector: str
    real_us: float | None
    control_us: dict[str, float | None] = field(default_factory=dict)  # control name -> median us

    @property
    def real_over_matched(self) -> float | None:
        matched = self.control_us.get("matched")
        if self.real_us is None or not matched:
            return None
        return self.real_us / matched


def _median(case: CaseResult | None, selector: str) -> float | None:
    timing = None if case is None else case.timed(selector)
    return None if timing is None else timing.median_us


def control_rows(result: ReplayResult) -> list[ControlRow]:
    """A row per (real case that has controls, selector), in replay order."""
    reals: dict[str, CaseResult] = {}
    controls: dict[str, dict[str, CaseResult]] = {}
    for case in result.cases:
        base, name = split_id(case.case_id)
        if name is None:
            reals[case.case_id] = case
        else:
            controls.setdefault(base, {})[name] = case
    rows = []
    for case_id, mine in controls.items():
        real = reals.get(case_id)
        for selector in result.selectors:
            rows.append(ControlRow(case_id, real.source if real else "-", selector, _median(real, selector),
                                   {name: _median(c, selector) for name, c in mine.items()}))
    return rows


__all__ = ["ControlRow", "control_rows"]
