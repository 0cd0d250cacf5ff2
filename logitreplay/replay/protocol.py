"""The timing protocol and the timings it produces: what every report's numbers mean.

The defaults live here and only here. On CUDA they are the published captured-logits protocol: 25
warmups, then 4 rounds x 10 samples that alternate across selectors, each launch a CUDA graph replay with
a cold L2. On CPU the algorithm models take milliseconds per call, so that protocol would take minutes:
the verification call is the only warmup, then 3 alternating rounds of one call, as wall clock.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# The CUDA protocol's defaults are the dataclass defaults below; the CPU reductions are these.
CPU_WARMUP, CPU_ROUNDS, CPU_SAMPLES = 0, 3, 1


@dataclass(frozen=True)
class TimingProtocol:
    """How a (case, selector) pair is timed. The defaults are the published captured-logits protocol."""

    warmup: int = 25
    rounds: int = 4
    samples_per_round: int = 10
    l2: Literal["cold", "warm"] = "cold"
    timer: Literal["events", "cupti", "wall"] = "events"
    graphs: bool = True

    @classmethod
    def for_device(cls, device_type: str, warmup: int | None = None, rounds: int | None = None,
                   l2: Literal["cold", "warm"] = "cold",
                   timer: Literal["events", "cupti"] = "events") -> TimingProtocol:
        """The protocol a replay on `device_type` uses, with the user's overrides (None: the default)."""
        if device_type == "cpu":
            return cls(warmup=CPU_WARMUP if warmup is None else warmup,
                       rounds=CPU_ROUNDS if rounds is None else rounds,
                       samples_per_round=CPU_SAMPLES, l2="warm", timer="wall", graphs=False)
        return cls(warmup=cls.warmup if warmup is None else warmup,
                   rounds=cls.rounds if rounds is None else rounds, l2=l2, timer=timer, graphs=True)

    def describe(self) -> str:
        """One line for a report's caption."""
        samples = f"{self.samples_per_round} sample{'s' if self.samples_per_round != 1 else ''}"
        rounds = f"{self.rounds} alternating round{'s' if self.rounds != 1 else ''} x {samples}"
        if self.timer == "wall":  # the CPU models: the verification call warms up too
            warm = "the verification call" + (f" and {self.warmup} more" if self.warmup else "")
            return f"warmup: {warm}; {rounds}, wall clock"
        line = f"warmup {self.warmup}, {rounds}"
        return line + f", timer {self.timer}, L2 {self.l2}, graphs {'on' if self.graphs else 'off'}"

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

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Timing:
        """The samples and clock; the statistics are derived from them, never read back."""
        return cls(samples_us=[float(x) for x in d["samples_us"]], clock=d["clock"])


__all__ = ["CPU_ROUNDS", "CPU_SAMPLES", "CPU_WARMUP", "Timing", "TimingProtocol"]
