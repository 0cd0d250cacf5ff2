"""Timing of prepared selector launches: warmups, then rounds that alternate across selectors
(A B A B ...), so drift in clocks or temperature spreads evenly over all of them instead of biasing
whichever ran last. Medians and spreads, never a single number.

On CPU this is wall clock of the algorithm models (labelled so in every report: not kernel times).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch

from logitreplay.selectors.base import Launch


@dataclass(frozen=True)
class TimingProtocol:
    """How a (case, selector) pair is timed. The defaults are the published captured-logits protocol."""

    warmup: int = 25
    rounds: int = 4
    samples_per_round: int = 10
    l2: Literal["cold", "warm"] = "cold"
    timer: Literal["events", "cupti", "wall"] = "events"
    graphs: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Timing:
    """Samples in microseconds, with the statistics reports show."""

    samples_us: list[float] = field(default_factory=list)
    clock: str = "wall"  # "wall" (CPU models), "cuda-events" or "cupti" (GPU kernels)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    def quantile(self, q: float) -> float:
        s = sorted(self.samples_us)
        return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]

    @property
    def cv(self) -> float:
        """Coefficient of variation (stdev / mean)."""
        if len(self.samples_us) < 2:
            return 0.0
        return statistics.stdev(self.samples_us) / statistics.fmean(self.samples_us)

    def to_json(self) -> dict[str, Any]:
        return {"clock": self.clock, "median_us": self.median_us, "p10_us": self.quantile(0.1),
                "p90_us": self.quantile(0.9), "cv": self.cv, "samples_us": self.samples_us}


def time_launches(launches: dict[str, Launch], device: torch.device,
                  protocol: TimingProtocol) -> dict[str, Timing]:
    """Time every launch with the protocol; returns one `Timing` per name."""
    if device.type == "cuda":
        from logitreplay.replay.timing_cuda import time_launches_cuda

        return time_launches_cuda(launches, device, protocol)
    return _time_cpu(launches, protocol)


def _time_cpu(launches: dict[str, Launch], protocol: TimingProtocol) -> dict[str, Timing]:
    for launch in launches.values():
        for _ in range(protocol.warmup):
            launch()
    out = {name: Timing(clock="wall") for name in launches}
    for _ in range(protocol.rounds):
        for name, launch in launches.items():
            for _ in range(protocol.samples_per_round):
                t0 = time.perf_counter()
                launch()
                out[name].samples_us.append((time.perf_counter() - t0) * 1e6)
    return out
