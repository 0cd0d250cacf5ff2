"""Timing of prepared selector launches: warmups, then rounds that alternate across selectors
(A B A B ...), so drift in clocks or temperature spreads evenly over all of them instead of biasing
whichever ran last. Medians and spreads, never a single number.

On CPU this is wall clock of the algorithm models (labelled so in every report: not kernel times).
"""

from __future__ import annotations

import time

import torch

from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.selectors.base import Launch


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


__all__ = ["Timing", "TimingProtocol", "time_launches"]
