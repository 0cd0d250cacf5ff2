"""vLLM 0.33's own kernels, run for real where their libraries are staged (LOGITREPLAY_VLLM_LIB: the
_C_stable_libtorch.abi3.so; LOGITREPLAY_VLLM_DS_LIB: _deepselect_C.abi3.so): every adapter verifies
(checks 1-5) on prefill and decode shapes, vllm-auto says which kernel vLLM runs, DeepSelect says when it
has no code for the GPU, and a sticky CUDA error in a plugin does not take a replay down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from logitreplay.archive import Archive, Case
from logitreplay.replay import TimingProtocol
from logitreplay.replay.engine import device_checks, replay_case
from logitreplay.selectors.registry import build

LIB = os.environ.get("LOGITREPLAY_VLLM_LIB")
DS_LIB = os.environ.get("LOGITREPLAY_VLLM_DS_LIB")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
needs_lib = pytest.mark.skipif(not LIB, reason="LOGITREPLAY_VLLM_LIB names no staged vLLM library")
DEVICE = torch.device("cuda")
QUICK = TimingProtocol.for_device("cuda", 2, 1)


def _case(rows: int, cols: int, k: int, seed: int, decode: bool = False) -> Case:
    rng = np.random.default_rng(seed)
    ends = (rng.integers(1, cols + 1, rows) if decode else cols - rows + np.arange(rows) + 1).astype(np.int32)
    ends[: min(2, rows)] = [k // 2, k][: min(2, rows)]  # rows at and below top_k: -1 tails
    values = rng.standard_normal(int(ends.sum())).astype(np.float32)
    attrs: dict = {"source": "test"}
    if decode:
        from logitreplay.archive.decode import DecodeFacts

        facts = DecodeFacts.from_row_ends(ends, next_n=1, per_row=False, max_model_len=cols)
        attrs.update(kind="decode", decode=facts.to_json())
    return Case.from_rows(f"t{rows}x{cols}k{k}s{seed}", values, np.zeros(rows, np.int32), ends, top_k=k, cols=cols,
                          attrs=attrs)


def _replay(case: Case, names: list[str]) -> dict[str, tuple[str, str | None]]:
    result = replay_case(case, [build(n) for n in names], DEVICE, QUICK, extra_checks=device_checks(DEVICE))
    return {r.selector.split("@")[0]: (r.status, r.reason) for r in result.results}


@needs_lib
def test_prefill_kernel_verifies_beside_native() -> None:
    got = _replay(_case(512, 8192, 512, 1), ["native", f"vllm-native@{LIB}", f"vllm-auto@{LIB}"])
    assert {k: s for k, (s, _) in got.items()} == {"native": "ok", "vllm-native": "ok", "vllm-auto": "ok"}
    assert "top_k_per_row_prefill" in (got["vllm-auto"][1] or "")
    assert "staging copy 1048576 B" in (got["vllm-native"][1] or "")


@needs_lib
@pytest.mark.parametrize(("rows", "k", "chosen"), [(8, 2048, "cooperative_topk"), (65, 2048, "persistent_topk"),
                                                   (16, 256, "top_k_per_row_decode")])
def test_decode_kernels_verify_and_auto_follows_vllm(rows: int, k: int, chosen: str) -> None:
    names = [f"vllm-{n}@{LIB}" for n in ("decode", "persistent", "cooperative", "auto")]
    got = _replay(_case(rows, 163840, k, rows, decode=True), ["native", *names])
    assert got["native"][0] == "ok" and got["vllm-decode"][0] == "ok" and got["vllm-auto"][0] == "ok", got
    assert chosen in (got["vllm-auto"][1] or "")
    if k == 2048:
        assert got["vllm-persistent"][0] == "ok", got
        assert got["vllm-cooperative"][0] == ("ok" if rows <= 64 else "unsupported"), got


@pytest.mark.skipif(not DS_LIB, reason="LOGITREPLAY_VLLM_DS_LIB names no staged DeepSelect library")
def test_deepselect_says_when_it_has_no_code_for_this_gpu() -> None:
    sel = build(f"vllm-deepselect@{DS_LIB}")
    why = sel.supports(_case(64, 8192, 512, 3), DEVICE)
    major, minor = torch.cuda.get_device_capability()
    if major != 10:
        assert why == f"no sm_{major}{minor} code in vllm._deepselect_C (it has sm_100)"
    else:
        assert why is None


def test_a_sticky_cuda_error_loses_only_its_own_result(tmp_path: Path) -> None:
    archive = Archive.create(tmp_path / "a.zarr")
    for i in range(3):
        archive.write(_case(64, 4096, 256, 10 + i))
    cmd = [sys.executable, "-c", "import sys; from logitreplay.cli import main; sys.exit(main())", "replay",
           str(tmp_path / "a.zarr"), "--device", "cuda", "--selectors", "native", "--selector",
           "tests.cuda_faults:sticky", "--rounds", "1", "--warmup", "1", "--strict", "--json", str(tmp_path / "r.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert proc.returncode == 1, proc.stderr[-2000:]
    cases = json.loads((tmp_path / "r.json").read_text())["cases"]
    assert [[r["status"] for r in c["results"]] for c in cases] == [["ok", "error"]] * 3, proc.stderr[-2000:]
    reasons = [c["results"][1]["reason"] for c in cases]
    assert reasons[0].startswith("CUDA context lost: "), reasons  # found in this process; the rest in children
    assert all(r for r in reasons), reasons
