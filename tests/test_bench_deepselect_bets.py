"""bench/deepselect_bets.py --rebet-ab: the CPU model of deepselect as built beside the same model with its
re-bet off, per case, so that a kernel A/B's time difference has a work difference beside it."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import torch

from logitreplay.archive import Case

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bets(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT))  # as tests/test_bench_deepselect_ab.py imports its script
    import bench.deepselect_bets as module

    return module


def test_rebet_ab_sets_the_work_as_built_beside_the_work_without_the_rebet(
        bets: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # rows of 2^16 normal values and k 2048: 32 rounds a row, so the re-bet runs after the fourth, and the
    # buffer is on course for more than half its capacity there (as on seed-controls' d-normal case)
    rows, cols = 4, 65536
    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(0))
    case = Case.from_matrix("d-like", x, torch.zeros(rows, dtype=torch.int32),
                            torch.full((rows,), cols, dtype=torch.int32), top_k=2048)
    monkeypatch.setattr(bets.synth, "recipes", lambda suite, scale: ["one"])
    monkeypatch.setattr(bets.synth, "generate", lambda recipe: case)
    bets.rebet_ab("any", rows)
    line = capsys.readouterr().out.splitlines()[-1]
    compacting, redone, candidates = (cell.split(" / ") for cell in line.strip("| ").split(" | ")[1:])
    assert int(compacting[0]) > 0 and compacting[1] == "0"  # the re-bet's compaction, and none without it
    assert redone == ["0", "0"]
    assert int(candidates[0]) < int(candidates[1])  # the compaction keeps fewer candidates
