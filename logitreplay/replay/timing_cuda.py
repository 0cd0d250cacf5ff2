"""GPU timing of prepared selector launches: the protocol of the published captured-logits tables.

Each launch is captured once in a CUDA graph of that one launch, so what is timed is the kernel(s), not
Python or the launch path. Before every timed replay a flush buffer several times the L2 is rewritten,
outside the timed region, so the selector starts cold as in production (the indexer's logits are
written long before the top-k runs and mostly evicted by then); `l2="warm"` skips the flush. Warmup
calls first, then rounds that alternate across selectors (A B A B ...), so clock or temperature drift
spreads over all of them. Per sample either a pair of CUDA events around the replay (`timer="events"`)
or, with `timer="cupti"`, the summed device durations of the selector's own kernels as the profiler
(CUPTI) records them: no launch gap, no event overhead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.selectors.base import Launch

# Writing this many L2 sizes evicts every line a case left there, whatever the replacement policy and
# however large the case (a case larger than the L2 leaves at most one L2 of itself behind).
FLUSH_L2_MULTIPLE = 4
# torch.cuda._sleep's kernel: a marker between profiled samples that no selector launches.
_MARKER = "spin_kernel"


def _graph(launch: Launch, device: torch.device, use_graph: bool) -> Callable[[], None]:
    """Warm the launch eagerly on a side stream (module loads, lazy init), then capture it once."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            launch()
    torch.cuda.current_stream(device).wait_stream(side)
    if not use_graph:
        return launch
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    return graph.replay


def flush_buffer(device: torch.device) -> torch.Tensor:
    """A buffer of FLUSH_L2_MULTIPLE x the L2, rewritten before each timed replay to evict the L2."""
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or 64 << 20
    return torch.empty(FLUSH_L2_MULTIPLE * l2 // 4, dtype=torch.int32, device=device)


def time_launches_cuda(launches: dict[str, Launch], device: torch.device,
                       protocol: TimingProtocol) -> dict[str, Timing]:
    """Time every launch on `device` with the protocol; one `Timing` (microseconds) per name."""
    with torch.cuda.device(device):
        replays = {name: _graph(launch, device, protocol.graphs) for name, launch in launches.items()}
        flush = flush_buffer(device) if protocol.l2 == "cold" else None
        for replay in replays.values():
            for _ in range(protocol.warmup):
                replay()
        torch.cuda.synchronize(device)
        if protocol.timer == "cupti":
            return _time_cupti(replays, flush, protocol)
        return _time_events(replays, flush, protocol)


def _schedule(names: list[str], protocol: TimingProtocol) -> list[str]:
    """Sample order: rounds alternating across selectors, `samples_per_round` each per round."""
    return [n for _ in range(protocol.rounds) for n in names for _ in range(protocol.samples_per_round)]


def _time_events(replays: dict[str, Callable[[], None]], flush: torch.Tensor | None,
                 protocol: TimingProtocol) -> dict[str, Timing]:
    order = _schedule(list(replays), protocol)
    events = []
    for name in order:
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        replays[name]()
        end.record()
        events.append((name, start, end))
    torch.cuda.synchronize()
    out = {name: Timing(clock="cuda-events") for name in replays}
    for name, start, end in events:
        out[name].samples_us.append(start.elapsed_time(end) * 1e3)
    return out


def _time_cupti(replays: dict[str, Callable[[], None]], flush: torch.Tensor | None,
                protocol: TimingProtocol) -> dict[str, Timing]:
    """Each sample is `marker, replay, flush`; the device activities between two markers, less the
    flush, are that sample's kernels (also memsets and copies a selector enqueues)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    order = _schedule(list(replays), protocol)
    if flush is not None:
        flush.zero_()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for name in order:
            torch.cuda._sleep(0)
            replays[name]()
            if flush is not None:
                flush.zero_()
        torch.cuda._sleep(0)
        torch.cuda.synchronize()
    kineto = prof.profiler.kineto_results if prof.profiler is not None else None
    if kineto is None:
        raise RuntimeError("the profiler returned no device activities (CUPTI unavailable?); use --timer events")
    acts = sorted((e for e in kineto.events()
                   if e.device_type() == DeviceType.CUDA and not e.is_user_annotation()),
                  key=lambda e: e.start_ns())
    samples: list[list[float]] = []
    for e in acts:
        if _MARKER in e.name():
            samples.append([])
        elif samples:
            samples[-1].append(e.duration_ns() / 1e3)
    samples = samples[:-1]  # after the closing marker: nothing
    if len(samples) != len(order):
        raise RuntimeError(f"profiler saw {len(samples)} samples, expected {len(order)}; use --timer events")
    out = {name: Timing(clock="cupti") for name in replays}
    for name, durations in zip(order, samples, strict=True):
        kernels = durations[:-1] if flush is not None else durations
        out[name].samples_us.append(sum(kernels))
    return out


def measure_read_bandwidth(device: torch.device, nbytes: int = 2 << 30, repeats: int = 10) -> float:
    """Read bandwidth in bytes/s: median time of a sum over a buffer far larger than the L2.

    A reduction reads every byte once and writes almost nothing, which is what a selector does with
    its logits; measured once per run, it turns each case's valid bytes into the read-floor column.
    """
    with torch.cuda.device(device):
        buf = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
        acc = torch.empty((), dtype=torch.float32, device=device)
        for _ in range(3):
            torch.sum(buf, dim=0, out=acc)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.sum(buf, dim=0, out=acc)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        del buf
    times.sort()
    return nbytes / times[len(times) // 2]
