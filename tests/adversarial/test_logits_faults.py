"""Hostile logits: every built-in selector either verifies against the reference or the case is reported
invalid (NaN), never a wrong answer and never a crash. Runs on CPU (algorithm models) and, on a GPU
machine, on the bundled CUDA kernels too."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.replay.engine import CaseResult, replay_case
from logitreplay.replay.protocol import TimingProtocol
from logitreplay.selectors.registry import build

K = 16
COLS = 256
ONE_CALL = TimingProtocol(warmup=0, rounds=1, samples_per_round=1, l2="warm", timer="wall", graphs=False)


def _rows(fill: Callable[[np.random.Generator, int], np.ndarray], lengths: list[int] | None = None,
          top_k: int = K, cols: int = COLS, case_id: str = "x", dtype: torch.dtype = torch.float32) -> Case:
    lengths = lengths or [cols, cols - 1, K + 1, K, K - 1, 1, 0, 100]
    rng = np.random.default_rng(3)
    starts = np.array([(cols - n) // 2 for n in lengths], np.int32)
    ends = starts + np.array(lengths, np.int32)
    values = torch.from_numpy(fill(rng, int(sum(lengths))).astype(np.float32)).to(dtype)
    return Case.from_rows(case_id, values, starts, ends, top_k=top_k, cols=cols)


def _bits(x: int) -> np.ndarray:
    return np.array([x], np.uint32).view(np.float32)


LOGITS: dict[str, Case] = {
    "normal": _rows(lambda r, n: r.standard_normal(n)),
    "all equal": _rows(lambda r, n: np.full(n, 0.3)),
    "exact zeros": _rows(lambda r, n: np.zeros(n)),
    "zeros of both signs": _rows(lambda r, n: np.where(r.random(n) < 0.5, -0.0, 0.0)),
    "denormals": _rows(lambda r, n: r.integers(1, 1 << 20, n).astype(np.uint32).view(np.float32)),
    "denormals of both signs": _rows(
        lambda r, n: (r.integers(1, 1 << 20, n).astype(np.uint32) | (r.integers(0, 2, n).astype(np.uint32) << 31))
        .view(np.float32)),
    "+inf and -inf inside rows": _rows(lambda r, n: np.where(r.random(n) < 0.1, np.inf,
                                                             np.where(r.random(n) < 0.1, -np.inf,
                                                                      r.standard_normal(n)))),
    "all -inf": _rows(lambda r, n: np.full(n, -np.inf)),
    "float32 extremes": _rows(lambda r, n: r.choice(np.array([3.4e38, -3.4e38, 1.2e-38, -1.2e-38, 1e30]), n)),
    "sorted ascending": _rows(lambda r, n: np.arange(n, dtype=np.float64)),
    "sorted descending": _rows(lambda r, n: -np.arange(n, dtype=np.float64)),
    "ties on a coarse grid": _rows(lambda r, n: np.round(r.standard_normal(n))),
    "k larger than every row": _rows(lambda r, n: r.standard_normal(n), lengths=[5, 0, 31, 63], top_k=64),
    "bf16 ties": _rows(lambda r, n: np.round(r.standard_normal(n) * 8) / 8, dtype=torch.bfloat16),
    "k = 4096": _rows(lambda r, n: r.standard_normal(n), lengths=[8192, 4097, 4096, 4095, 3], top_k=4096,
                      cols=8192),
    "2^23 columns": _rows(lambda r, n: r.standard_normal(n), lengths=[1 << 23, 1 << 22], top_k=2048,
                          cols=1 << 23),
}


def _devices() -> list[pytest.param]:  # type: ignore[valid-type]
    return [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _run(case: Case, device: str) -> CaseResult:
    selectors = [build(n) for n in ("reference", "native", "deepselect")]
    return replay_case(case, selectors, torch.device(device), ONE_CALL)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("name", sorted(LOGITS))
def test_every_selector_verifies_or_declines(name: str, device: str) -> None:
    result = _run(LOGITS[name], device)
    assert result.invalid is None
    for r in result.results:
        assert r.status in ("ok", "unsupported"), f"{r.selector}: {r.status} {r.reason} {r.failures[:1]}"
    assert result.result("reference").status == "ok"  # type: ignore[union-attr]
    if device == "cpu":  # the models implement every case the reference does
        assert all(r.status == "ok" for r in result.results)


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("where", ["first", "last", "only"])
def test_nan_inside_a_row_makes_the_case_invalid_never_timed(where: str, device: str) -> None:
    def fill(r: np.random.Generator, n: int) -> np.ndarray:
        x = r.standard_normal(n)
        x[{"first": 0, "last": n - 1, "only": n // 2}[where]] = np.nan
        return x

    result = _run(_rows(fill), device)
    assert result.invalid is not None and "NaN" in result.invalid
    assert result.results == []
