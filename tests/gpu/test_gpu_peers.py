"""The DSA top-k peers (FlashInfer, SGLang v2, sgl-kernel, cuDNN's indexer top-k, upstream DeepSelect), run
for real where they are staged (bench/peers_gpu.sh puts them on the path; staging/stage_cudnn.sh stages
cuDNN's): each verifies (checks 1-7, the graph replay included) on every case it accepts and declines
the rest with a reason, never an error; sgl-kernel's fast top-k drops candidates once one coarse bin
holds more than its buffer, which is that peer's result. Every column of a staged release under
$LOGITREPLAY_STAGED (default /tmp/staged: vLLM 0.33.0 and 0.34.0, FlashInfer 0.7.4, as staging/ lays
them out) does the same, each in a process of its own (two releases of one package cannot share one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch

from logitreplay.archive import Case
from logitreplay.replay import TimingProtocol
from logitreplay.replay.engine import device_checks, replay_case
from logitreplay.selectors.registry import build
from logitreplay.selectors.upstream import Upstream, catalog

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
DEVICE = torch.device("cuda")
# Every adapter but vLLM's (tests/gpu/test_vllm_kernels.py runs those).
PEER_FAMILIES = ("flashinfer", "sglang", "sgl_kernel common_ops", "cudnn", "deep_select")
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
    """Whether the package this adapter was read from is here: installed, at a version it takes."""
    sel = build(name)
    found = sel.find() if isinstance(sel, Upstream) else None
    if isinstance(found, str):
        return not found.startswith("not installed")
    return not (isinstance(sel, Upstream) and found is not None and sel.declared.release.refuses(found.version))


def verify(spec: str) -> list[tuple[str, str, str | None]]:
    """(case, status, reason) of the selector `spec` on every case of CASES."""
    seen = []
    for case in CASES:
        [res] = replay_case(case, [build(spec)], DEVICE, QUICK, extra_checks=device_checks(DEVICE)).results
        seen.append((case.case_id, res.status, res.reason))
    return seen


def _verified(seen: list[tuple[str, str, str | None]]) -> None:
    assert all(status in ("ok", "unsupported") and reason for _, status, reason in seen), seen  # each says why
    if all(status == "unsupported" and (reason or "").startswith("no sm_") for _, status, reason in seen):
        pytest.skip(f"no code for this GPU: {seen[0][2]}")
    # a release built against another torch's ABI (sglang-kernel 0.4.9 and newer: torch 2.14.1) declines
    # every case with that one line, which is its column's answer on this torch, not a failure
    if all(status == "unsupported" and " is built for torch " in (reason or "") for _, status, reason in seen):
        pytest.skip(f"built for another torch: {seen[0][2]}")
    assert any(status == "ok" for _, status, _ in seen), seen


@pytest.mark.parametrize("name", sorted(n for n, e in catalog.adapters().items() if e.declared.family in PEER_FAMILIES))
def test_each_peer_verifies_what_it_accepts_and_declines_the_rest(name: str) -> None:
    if not _staged(name):
        pytest.skip(f"{name}: its package is not staged here")
    _verified(verify(name))


STAGED_COLUMNS = [c for c in catalog.columns(catalog.staged(os.environ.get("LOGITREPLAY_STAGED", "/tmp/staged")))
                  if "@" in c]


def _in_a_process(func: str, spec: str) -> list[tuple[Any, ...]]:
    """`func(spec)` of this module run in a fresh process (a staged release cannot share one with another
    release of its package), its rows read back."""
    code = f"import json, sys; from tests.gpu.test_gpu_peers import {func}; print(json.dumps({func}(sys.argv[1])))"
    done = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return [tuple(r) for r in json.loads(done.stdout.strip().splitlines()[-1])]


@pytest.mark.parametrize("spec", STAGED_COLUMNS or [pytest.param("", marks=pytest.mark.skip("no staged release"))])
def test_each_staged_release_verifies_in_a_process_of_its_own(spec: str) -> None:
    _verified(_in_a_process("verify", spec))


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


def _short_rows(rows: int, cols: int, k: int) -> Case:
    """Every row at most `cols` < k long: IndexerTopK's trivial path (indices 0.. then -1)."""
    rng = np.random.default_rng(cols)
    ends = rng.integers(0, cols + 1, rows).astype(np.int32)
    values = rng.standard_normal(int(ends.sum())).astype(np.float32)
    return Case.from_rows(f"short-{rows}x{cols}-k{k}", values, np.zeros(rows, np.int32), ends, top_k=k, cols=cols,
                          attrs={"source": "test"})


# The shapes IndexerTopK's build branches on (indexer_top_k_decode_varlen.py, indexer_top_k_varlen_util.py):
# float32's two radix passes or 16-bit keys' one, more than 148 rows (its large-occupancy build), more
# than 65536 columns (32-bit candidate indices), a width that is no power of two (the build rounds it
# up; the rows' lengths bound the reads), k below and at its limit, rows no longer than k.
CUDNN_CASES = [
    _case("decode-160x66000-k2048", 160, 66000, 2048, seed=6),
    _case("decode-bf16-16x8191-k100", 16, 8191, 100, dtype=torch.bfloat16, seed=7),
    _case("decode-4x5000-k1", 4, 5000, 1, seed=8),
    _short_rows(6, 1000, 2048),
]


def test_cudnn_indexer_topk_verifies_on_the_shapes_its_build_branches_on() -> None:
    if not _staged("cudnn-indexer-topk"):
        pytest.skip("nvidia-cudnn-frontend is not staged here")
    seen = []
    for case in CUDNN_CASES:
        [res] = replay_case(case, [build("cudnn-indexer-topk")], DEVICE, QUICK,
                            extra_checks=device_checks(DEVICE)).results
        seen.append((case.case_id, res.status, res.reason))
    assert all(status == "ok" for _, status, _ in seen), seen


def _plateau(name: str, rows: int, cols: int, k: int, dtype: torch.dtype = torch.float32) -> Case:
    """ReLU-like rows: a few hundred positive scores, the rest exact zeros, so the k-th value is 0 with
    thousands tied at it and a selector's choice among them is visible."""
    rng = np.random.default_rng(cols + k)
    values = np.zeros((rows, cols), np.float32)
    for r in range(rows):
        values[r, rng.choice(cols, k // 3, replace=False)] = np.abs(rng.standard_normal(k // 3)) + 0.5
    return Case.from_rows(name, torch.from_numpy(values.reshape(-1)).to(dtype), np.zeros(rows, np.int32),
                          np.full(rows, cols, np.int32), top_k=k, cols=cols, attrs={"source": "test"})


DETERMINISTIC_PEERS = ("flashinfer-ragged-det", "flashinfer-paged-det", "cudnn-indexer-topk-det")
# cuDNN 1.32.0 states its deterministic policy: the lowest columns among the tied, ascending.
STATED_LOWEST = ("cudnn-indexer-topk-det",)


def rerun_tied(spec: str) -> list[tuple[str, str, str | None, bool, str | None]]:
    """(case, status, reason, deterministic, tie policy) of the selector `spec` on tied rows, every verified
    answer rerun 5 times under load."""
    seen = []
    for case in (_plateau("plateau-64x32768-k2048", 64, 32768, 2048),
                 _plateau("plateau-bf16-8x65536-k512", 8, 65536, 512, torch.bfloat16)):
        [res] = replay_case(case, [build(spec)], DEVICE, QUICK, extra_checks=device_checks(DEVICE),
                            determinism=5).results
        seen.append((case.case_id, res.status, res.reason,
                     res.determinism is not None and res.determinism.deterministic, res.tie_policy))
    return seen


# Each deterministic call on the installed package and on every staged release that has it (FlashInfer's
# arrive with 0.7.4, a staged release beside the installed 0.7.2.post1).
DETERMINISTIC_COLUMNS = [*DETERMINISTIC_PEERS, *(c for c in STAGED_COLUMNS if c.partition("@")[0] in DETERMINISTIC_PEERS)]


@pytest.mark.parametrize("spec", DETERMINISTIC_COLUMNS)
def test_deterministic_peers_repeat_their_output_on_tied_rows_under_reruns(spec: str) -> None:
    if "@" in spec:
        seen = _in_a_process("rerun_tied", spec)
    elif _staged(spec):
        seen = rerun_tied(spec)
    else:
        pytest.skip(f"{spec}: its package is not staged here")
    for case_id, status, reason, deterministic, policy in seen:
        assert status == "ok", (case_id, reason)
        assert deterministic, case_id
        if spec.partition("@")[0] in STATED_LOWEST:
            assert policy == "lowest", (case_id, policy)
