"""`replay --determinism N` on CUDA (determinism.py): both ways a rerun calls a launch (a CUDA graph replay,
and a plain launch on a second stream under a concurrent copy) leave a deterministic kernel's output
verified and identical, and catch a launch whose output changes from call to call on the device."""

from __future__ import annotations

import pytest
import torch

from logitreplay.replay.determinism import rerun
from logitreplay.replay.verify import OutputBuffer
from logitreplay.selectors.reference import ReferenceSelector

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEVICE = torch.device("cuda")
ROWS, COLS, K = 64, 4096, 256


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, OutputBuffer]:
    logits = torch.randn(ROWS, COLS, device=DEVICE)
    starts = torch.zeros(ROWS, dtype=torch.int32, device=DEVICE)
    ends = torch.full((ROWS,), COLS, dtype=torch.int32, device=DEVICE)
    return logits, starts, ends, OutputBuffer(ROWS, K, DEVICE)


def test_reruns_of_a_deterministic_selector_agree_in_both_ways_of_calling() -> None:
    logits, starts, ends, out = _inputs()
    launch = ReferenceSelector().prepare(logits, starts, ends, K, out.view)
    launch()
    torch.cuda.synchronize()
    found = rerun(launch, out, 4, DEVICE)
    assert (found.runs, found.deterministic, found.first_row) == (5, True, None)


def test_an_output_that_changes_on_the_device_is_caught_by_graph_replays_and_loaded_launches() -> None:
    _, _, _, out = _inputs()
    first = torch.arange(K, dtype=torch.int32, device=DEVICE).expand(ROWS, K).contiguous()
    other = first.clone()
    other[7, :2] = torch.tensor([K, K + 1], dtype=torch.int32, device=DEVICE)  # another set in row 7
    calls = torch.zeros((), dtype=torch.int64, device=DEVICE)

    def launch() -> None:  # graph-capturable: the choice is made on the device, from a device counter
        out.view.copy_(torch.where(calls % 2 == 0, first, other))
        calls.add_(1)

    launch()
    found = rerun(launch, out, 4, DEVICE)
    assert not found.deterministic and found.distinct_sets == 2 and found.first_row == 7
