"""`replay --determinism N`: does a verified selector return the same indices, run after run?

RL training, batch-invariant serving and tensor-parallel ranks that must pick the same KV blocks need the
same index set for the same input every time, and usually the same order. Checks 1-7 cannot say: they
judge values, and any choice among tied candidates passes them. This check reruns a selector that passed
them `N` more times on the same inputs, the way it is timed, and compares every run's output with the
output of its last timed call (the one check 7 verified):

- on CPU: plain calls of the launch;
- on CUDA: alternately a replay of a CUDA graph of the launch, and a plain launch on a second stream
  while a memory-bound copy runs on a third (`_under_load`), so that blocks are scheduled, and atomics
  race, differently from the timed replays.

What it proves: the selector returned identical index sets (and orders) in every run it was given, on
these inputs, under these conditions. What it cannot: that it always will; a race that needs other
contention, other clocks or other inputs to show stays unseen. N runs that agree bound nothing; one run
that differs proves nondeterminism.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from logitreplay.replay.verify import OutputBuffer
from logitreplay.selectors.base import Launch

# Copies of the load buffer per plain launch under load: enough to outlast a top-k kernel of a large case.
_LOAD_COPIES = 4


@dataclass(frozen=True)
class Determinism:
    """What `N` reruns of a verified selector showed on one case: `runs` outputs compared (the last timed
    call's and the reruns'); `same_sets`: every row's index set was the same in every run; `same_order`:
    every output was identical slot for slot; `deterministic`: both; `distinct_sets`: how many different
    outputs, rows compared as sets, were seen; `first_row`: the first row that differed from the last
    timed call's, as a set or in order (None when none did)."""

    runs: int
    deterministic: bool
    same_sets: bool
    same_order: bool
    distinct_sets: int
    first_row: int | None

    def short(self) -> str:
        """The wide table's words: `det`, or `nondet (order, row R)` / `nondet (N sets, row R)`."""
        if self.deterministic:
            return "det"
        return f"nondet ({'order' if self.same_sets else f'{self.distinct_sets} sets'}, row {self.first_row})"

    def __str__(self) -> str:
        if self.deterministic:
            return f"deterministic over {self.runs} runs"
        what = "same index sets in another order" if self.same_sets else f"{self.distinct_sets} distinct index sets"
        return f"not deterministic over {self.runs} runs: {what}, first differing row {self.first_row}"


def _under_load(launch: Launch, device: torch.device) -> Callable[[], None]:
    """The launch on a stream of its own while a memory-bound copy (several L2 sizes) runs on another."""
    from logitreplay.replay.timing_cuda import flush_buffer

    work, load = torch.cuda.Stream(device), torch.cuda.Stream(device)
    src = flush_buffer(device)
    dst = torch.empty_like(src)

    def run() -> None:
        current = torch.cuda.current_stream(device)
        work.wait_stream(current)
        load.wait_stream(current)
        with torch.cuda.stream(load):
            for _ in range(_LOAD_COPIES):
                dst.copy_(src)
        with torch.cuda.stream(work):
            launch()
        current.wait_stream(work)
        current.wait_stream(load)

    return run


def _runners(launch: Launch, device: torch.device) -> list[Callable[[], None]]:
    """The ways a rerun calls the launch, used in turn (module docstring)."""
    if device.type != "cuda":
        return [launch]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    return [graph.replay, _under_load(launch, device)]


def rerun(launch: Launch, output: OutputBuffer, runs: int, device: torch.device) -> Determinism:
    """Run `launch` `runs` more times into `output` (reset before each) and compare every output with the
    one `output` holds now (the last timed call's); `output` holds the last rerun's afterwards."""
    first = output.view.clone()
    first_sets = first.sort(dim=1).values
    seen: list[torch.Tensor] = []  # the distinct sorted outputs that differ from the first
    same_sets = same_order = True
    differing: torch.Tensor | None = None
    runners = _runners(launch, device)
    for i in range(runs):
        output.reset()
        runners[i % len(runners)]()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        got = output.view
        if torch.equal(got, first):
            continue
        sets = got.sort(dim=1).values
        rows = (got != first).any(1)
        differing = rows if differing is None else differing | rows
        same_order = False
        if not torch.equal(sets, first_sets):
            same_sets = False
            if not any(torch.equal(sets, s) for s in seen):
                seen.append(sets)
    first_row = None if differing is None else int(differing.nonzero()[0, 0])
    return Determinism(runs + 1, same_sets and same_order, same_sets, same_order, 1 + len(seen), first_row)


__all__ = ["Determinism", "rerun"]
