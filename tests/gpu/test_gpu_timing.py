"""The CUDA timing protocol: every selector gets its samples from both timers, cold and warm, and the
environment a report needs is recorded. (Timing *values* are measured in bench/, never asserted here.)"""

from __future__ import annotations

import math

import pytest
import torch

from logitreplay.replay import (
    TimingProtocol,
    environment,
    measure_read_bandwidth,
    sm_clock_mhz,
    time_launches,
    timing_cuda,
)
from logitreplay.replay.timing_cuda import flush_buffer
from logitreplay.selectors.cuda.kernels import NativeCuda

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = torch.device("cuda")


def _launches() -> dict:  # type: ignore[type-arg]
    logits = torch.randn(256, 8192, device=DEVICE)
    starts = torch.zeros(256, dtype=torch.int32, device=DEVICE)
    ends = torch.full((256,), 8192, dtype=torch.int32, device=DEVICE)
    out = torch.empty((256, 512), dtype=torch.int32, device=DEVICE)
    native = NativeCuda().prepare(logits, starts, ends, 512, out)
    ref_out = torch.empty((256, 512), dtype=torch.int64, device=DEVICE)
    ref_vals = torch.empty((256, 512), device=DEVICE)

    def topk() -> None:
        torch.topk(logits, 512, dim=1, out=(ref_vals, ref_out))

    return {"native": native, "topk": topk}


@pytest.mark.parametrize("timer", ["events", "cupti"])
@pytest.mark.parametrize("l2", ["cold", "warm"])
def test_every_selector_gets_all_its_samples(timer: str, l2: str) -> None:
    protocol = TimingProtocol(warmup=3, rounds=2, samples_per_round=3, l2=l2, timer=timer)  # type: ignore[arg-type]
    timings = time_launches(_launches(), DEVICE, protocol)
    assert set(timings) == {"native", "topk"}
    for t in timings.values():
        assert t.clock == ("cupti" if timer == "cupti" else "cuda-events")
        assert len(t.samples_us) == 6
        assert all(s > 0 and math.isfinite(s) for s in t.samples_us)


@pytest.mark.parametrize("timer", ["events", "cupti"])
def test_cold_timing_rewrites_more_than_the_l2_before_samples(timer: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cold L2 means a buffer larger than the device's L2 is rewritten between samples; warm timing
    writes none."""
    made: list[torch.Tensor] = []

    def tracked(device: torch.device) -> torch.Tensor:
        made.append(flush_buffer(device).fill_(7))
        return made[-1]

    monkeypatch.setattr(timing_cuda, "flush_buffer", tracked)
    quick = {"warmup": 1, "rounds": 1, "samples_per_round": 2, "timer": timer}
    time_launches(_launches(), DEVICE, TimingProtocol(l2="cold", **quick))  # type: ignore[arg-type]
    assert len(made) == 1
    assert made[0].numel() * made[0].element_size() > torch.cuda.get_device_properties(DEVICE).L2_cache_size
    assert int(made[0].abs().max()) == 0, "the flush buffer was not rewritten"
    time_launches(_launches(), DEVICE, TimingProtocol(l2="warm", **quick))  # type: ignore[arg-type]
    assert len(made) == 1


def test_environment_and_bandwidth_are_recorded() -> None:
    env = environment(DEVICE)
    assert env["gpu"] and env["torch"] == torch.__version__ and env["cuda_runtime"] == torch.version.cuda
    assert env["sm_count"] > 0 and env["l2_bytes"] > 0
    clock = sm_clock_mhz(DEVICE)
    assert clock is None or clock > 0
    bw = measure_read_bandwidth(DEVICE, nbytes=256 << 20, repeats=3)
    assert math.isfinite(bw) and bw > 0
