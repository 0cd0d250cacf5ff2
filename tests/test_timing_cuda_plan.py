"""What the GPU timing and the graph check do, checked without a GPU: the sample order alternates across
selectors, and the bounds change of check 5 stays inside the old bounds while creating -1 tails."""

from __future__ import annotations

import torch

from logitreplay.replay.graph_check import changed_ends
from logitreplay.replay.protocol import TimingProtocol
from logitreplay.replay.timing_cuda import _schedule


def test_rounds_alternate_across_selectors() -> None:
    order = _schedule(["a", "b"], TimingProtocol(rounds=3, samples_per_round=2))
    assert order == ["a", "a", "b", "b"] * 3


def test_graph_check_bounds_shrink_inside_and_fall_below_top_k() -> None:
    starts = torch.tensor([0, 0, 100, 100, 7], dtype=torch.int32)
    ends = torch.tensor([4096, 4096, 5000, 5000, 7], dtype=torch.int32)
    new = changed_ends(starts, ends, top_k=512)
    assert new.dtype == ends.dtype
    assert bool(((new >= starts) & (new <= ends)).all())
    lengths = new - starts
    assert bool((lengths[1::2] < 512).all())  # odd rows get -1 tails they did not have
    assert bool((lengths[[0, 2]] >= 512).all())  # even rows stay long, but shorter than before
    assert bool((new[[0, 2]] < ends[[0, 2]]).all())
