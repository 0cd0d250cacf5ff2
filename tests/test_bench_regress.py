"""bench/regress.py, the GPU regression check, on CPU: its fixed cases exist in their suites and cover every
bundled kernel, it picks the last committed baseline of the same GPU, and `logitreplay compare` fails it on
a slowed case (synthetic report pairs, no GPU)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from logitreplay.datasets import synth
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult, write_json
from logitreplay.selectors.provenance import BUNDLED

ROOT = Path(__file__).resolve().parents[1]
H200 = "NVIDIA H200"
ENV = {"python": "3.12", "torch": "2.11.0", "numpy": "2.3", "platform": "Linux", "cpu": "x86_64"}


@pytest.fixture(scope="module")
def regress() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    import regress

    return regress


def report(times: dict[tuple[str, str], float], gpu: str = H200, seed: int = 0) -> ReplayResult:
    """A CUDA replay report of the default protocol: (case id, selector) -> a median, 40 samples
    within +-0.5% of it."""
    rng = np.random.default_rng(seed)
    selectors = list(dict.fromkeys(s for _, s in times))
    cases = []
    for case_id in dict.fromkeys(c for c, _ in times):
        results = [SelectorResult(s, "ok", timing=Timing(list(times[(case_id, s)] * (1 + rng.uniform(-0.005, 0.005, 40))),
                                                         "cuda-events"))
                   for s in selectors if (case_id, s) in times]
        cases.append(CaseResult(case_id, 8, 163840, 2048, "float32", 163840, "normal", 1 << 20, results=results))
    return ReplayResult("cuda:0", "CUDA kernel time", TimingProtocol(), {**ENV, "gpu": gpu}, selectors[0], selectors, cases)


BASE = {("x-c8192", "native"): 100.0, ("x-c8192", "deepselect"): 120.0, ("y-c65536", "deepselect"): 200.0}


def commit(results: Path, folder: str, suite: str, times: dict[tuple[str, str], float], gpu: str = H200) -> Path:
    path = results / folder / "regress" / f"{suite}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(report(times, gpu), path)
    return path


def test_the_fixed_cases_exist_in_their_suites_and_cover_every_bundled_kernel(regress: ModuleType) -> None:
    assert set(regress.CASES) == set(BUNDLED)
    for suite, (kernels, ids) in regress.plan().items():
        assert set(ids) <= {r.case_id for r in synth.recipes(suite, "full")}, suite
        cmd = regress.replay_command(suite, kernels, ids, Path("out"))
        assert "--strict" in cmd and cmd.count("--case") == len(ids) and cmd[cmd.index("--scale") + 1] == "full"


def test_the_baseline_is_the_newest_committed_run_on_the_same_gpu(regress: ModuleType, tmp_path: Path) -> None:
    commit(tmp_path, "h200-2026-12-03", "indexer", BASE)
    newest = commit(tmp_path, "h200-2026-12-05/rebet", "indexer", BASE)
    commit(tmp_path, "b200-2026-12-09", "indexer", BASE, gpu="NVIDIA B200")
    commit(tmp_path, "h200-2026-12-09", "stress", BASE)
    assert regress.baseline(tmp_path, "indexer", H200) == newest
    assert regress.baseline(tmp_path, "indexer", "NVIDIA B200") == tmp_path / "b200-2026-12-09/regress/indexer.json"
    assert regress.baseline(tmp_path, "decode", H200) is None


def test_a_slowed_case_fails_the_check_and_names_itself(regress: ModuleType, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    commit(results, "h200-2026-12-05", "indexer", BASE)
    out.mkdir()
    suites = {"indexer": (["native", "deepselect"], ["x-c8192", "y-c65536"])}
    write_json(report(BASE, seed=1), out / "indexer.json")
    status, lines = regress.check(out, results, suites=suites)
    assert status == 0 and lines[0].startswith("ok indexer against h200-2026-12-05/regress/indexer.json")

    write_json(report({**BASE, ("y-c65536", "deepselect"): 200.0 * 1.08}, seed=1), out / "indexer.json")
    status, lines = regress.check(out, results, suites=suites)
    assert status == 1 and lines[0].startswith("REGRESSION indexer") and "y-c65536/deepselect 1.0" in lines[0]
    assert "x-c8192" not in lines[0]
    assert "--fail-above 1.05" in capsys.readouterr().err  # compare's own one-line reason


def test_a_kernel_the_baseline_timed_and_this_run_did_not_fails(regress: ModuleType, tmp_path: Path) -> None:
    results, out = tmp_path / "results", tmp_path / "out"
    commit(results, "h200-2026-12-05", "indexer", BASE)
    out.mkdir()
    write_json(report({k: v for k, v in BASE.items() if k[1] != "native"}, seed=2), out / "indexer.json")
    status, lines = regress.check(out, results, suites={"indexer": (["native", "deepselect"], ["x-c8192"])})
    assert status == 1 and "x-c8192/native timed in the baseline, not now" in lines[0]


def test_no_baseline_or_no_report_is_said_and_never_passes(regress: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    write_json(report(BASE), out / "indexer.json")
    suites = {"indexer": (["native"], ["x-c8192"])}
    status, lines = regress.check(out, tmp_path / "results", suites=suites)
    assert status == 2 and lines[0].startswith("NO BASELINE indexer")
    status, lines = regress.check(out, tmp_path / "results", suites={**suites, "stress": (["native"], ["z"])})
    assert status == 1 and lines[1].startswith("FAILED stress: no report")


def test_the_gpu_scripts_run_the_check(regress: ModuleType) -> None:
    for script in ("gpu_check.sh", "peers_gpu.sh"):
        assert "bench/regress.py" in (ROOT / "bench" / script).read_text(), script
