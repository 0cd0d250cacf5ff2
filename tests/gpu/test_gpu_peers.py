"""The DSA top-k peers (FlashInfer, SGLang v2, sgl-kernel, upstream DeepSelect), run for real where they
are staged (bench/peers_gpu.sh puts them on the path): each verifies (checks 1-7, the graph replay
included) on every case it accepts and declines the rest with a reason, never an error; sgl-kernel's
fast top-k drops candidates once one coarse bin holds more than its buffer, which is that peer's result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.replay import TimingProtocol
from logitreplay.replay.engine import device_checks, replay_case
from logitreplay.selectors.external import EXTERNAL
from logitreplay.selectors.registry import build
from logitreplay.selectors.upstream import Upstream

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICE = torch.device("cuda")
QUICK = TimingProtocol.for_device("cuda", 1, 1)


def _case(name: str, rows: int, cols: int, k: int, *, starts: bool = False, stride: int | None = None,
          dtype: torch.dtype = torch.float32, seed: int = 0) -> Case:
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, cols // 4, rows).astype(np.int32) if starts else np.zeros(rows, np.int32)
    ends = np.minimum(lo + rng.integers(1, cols, rows), cols).astype(np.int32)
    ends[:2] = lo[:2] + np.array([k // 2, k])  # rows below and at top_k: -1 tails, whole rows
    values = torch.from_numpy(rng.standard_normal(int((ends - lo).sum())).astype(np.float32)).to(dtype)
    return Case.from_rows(name, values, lo, ends, top_k=k, cols=cols, row_stride=stride,
                          attrs={"source": "test"})


CASES = [
    _case("decode-8x32768-k2048", 8, 32768, 2048),
    _case("prefill-64x8192-k2048-starts", 64, 8192, 2048, starts=True, seed=1),
    _case("prefill-64x8192-k512-starts", 64, 8192, 512, starts=True, seed=2),
    _case("padded-16x8192-k2048", 16, 8192, 2048, stride=8192 + 64, seed=3),
    _case("bf16-8x16384-k2048", 8, 16384, 2048, dtype=torch.bfloat16, seed=4),
    _case("k4096-4x32768", 4, 32768, 4096, seed=5),
]


def _staged(name: str) -> bool:
    sel = build(name)
    found = sel.find() if isinstance(sel, Upstream) else None
    return not (isinstance(found, str) and found.startswith("not installed"))


@pytest.mark.parametrize("name", sorted(EXTERNAL))
def test_each_peer_verifies_what_it_accepts_and_declines_the_rest(name: str) -> None:
    if not _staged(name):
        pytest.skip(f"{name}: its package is not staged here")
    seen = []
    for case in CASES:
        [res] = replay_case(case, [build(name)], DEVICE, QUICK, extra_checks=device_checks(DEVICE)).results
        seen.append((case.case_id, res.status, res.reason))
        assert res.status in ("ok", "unsupported"), seen
        assert res.reason, seen  # a decline says why; a run says what ran (its note)
    assert any(status == "ok" for _, status, _ in seen), seen


def _one_bin(count: int, rows: int = 4, cols: int = 32768) -> Case:
    rng = np.random.default_rng(count)
    parts = []
    for _ in range(rows):
        row = (-50 + rng.standard_normal(cols)).astype(np.float32)
        row[rng.choice(cols, count, replace=False)] = (1 + np.arange(count) * (5e-4 / count)).astype(np.float32)
        parts.append(row)
    return Case.from_rows(f"onebin-{count}", np.concatenate(parts), np.zeros(rows, np.int32),
                          np.full(rows, cols, np.int32), top_k=2048, cols=cols, attrs={"source": "test"})


def test_sgl_fast_topk_is_exact_until_one_bin_outgrows_its_candidate_buffer() -> None:
    if not _staged("sgl-fast-topk"):
        pytest.skip("sgl-kernel is not staged here")
    status = {}
    for count in (4096, 8192):
        [res] = replay_case(_one_bin(count), [build("sgl-fast-topk")], DEVICE, QUICK).results
        status[count] = res.status
    assert status == {4096: "ok", 8192: "failed"}, status
