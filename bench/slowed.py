"""A selector made deliberately 10% slower, for `bench/decisions.py`: does `compare` flag a known slowdown?

`native_slower` wraps the bundled `native` under the same name (so `compare` pairs it with native in the
base report) and appends, to every launch, a spin that lasts 10% of the launch's own time: on CUDA a
`torch.cuda._sleep` kernel on the same stream (captured in the graph with the launch), calibrated in
`prepare` against the launch's measured median; on CPU a busy wait of 10% of its measured wall time.
The selection itself is native's, so every verification check still applies.
"""

from __future__ import annotations

import statistics
import time

import torch

from logitreplay.archive import Case
from logitreplay.selectors import Launch, build

SLOWDOWN = 0.10


def _median_us(launch: Launch, device: torch.device, n: int = 20) -> float:
    if device.type != "cuda":  # the CPU models take milliseconds to seconds a call: 3 calls
        samples = []
        for _ in range(min(n, 3)):
            t0 = time.perf_counter()
            launch()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    launch()
    torch.cuda.synchronize(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(n):
        start.record()
        launch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


_CYCLES_PER_US: dict[int, float] = {}


def _cycles_per_us(device: torch.device) -> float:
    index = device.index or 0
    if index not in _CYCLES_PER_US:
        cycles = 10_000_000
        _CYCLES_PER_US[index] = cycles / _median_us(lambda: torch.cuda._sleep(cycles), device, 5)
    return _CYCLES_PER_US[index]


class Slower:
    def __init__(self, inner_name: str = "native") -> None:
        self.inner = build(inner_name)
        self.name = self.inner.name

    def supports(self, case: Case, device: torch.device) -> str | None:
        return self.inner.supports(case, device)

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, top_k: int,
                out: torch.Tensor) -> Launch:
        launch = self.inner.prepare(logits, row_starts, row_ends, top_k, out)
        extra_us = SLOWDOWN * _median_us(launch, logits.device)
        if logits.device.type == "cuda":
            cycles = max(1, int(extra_us * _cycles_per_us(logits.device)))

            def slowed() -> None:
                launch()
                torch.cuda._sleep(cycles)

            return slowed

        def spun() -> None:
            launch()
            until = time.perf_counter() + extra_us * 1e-6
            while time.perf_counter() < until:
                pass

        return spun


def native_slower() -> Slower:
    return Slower("native")
