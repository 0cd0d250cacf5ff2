"""On a GPU, a selector that triggers an illegal memory access kills its process's CUDA context; with
`replay --isolate` that costs only its own results, and every other selector still verifies and times.

The replay runs as a command of its own, as a user runs it, so the CUDA state earlier tests left in this
process (a context, a stream, a capture) is not the command's. A run that does not end within RUN_S
fails with the command's Python stacks (faulthandler on SIGABRT) instead of stalling the suite."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from logitreplay.archive import Archive
from tests.plugins import plugin_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")]

ROOT = Path(__file__).resolve().parents[2]
# Seconds the whole command may take: several times what its 5 workers (one per selector, the culprit's
# one per case), each starting CUDA, and the cold kernel builds (seconds each) need, and less than the
# 300 s bench/peers_gpu.sh gives one test; a step that hangs is cut by --timeout first and is reported.
RUN_S = 240
STEP_S = 60  # --timeout: one selector on one case, its worker's CUDA start-up and kernel build included


def _run(args: list[str], log: Path) -> tuple[int, str]:
    """The command's exit status and stderr (kept in `log`); fails with its stacks when it runs past RUN_S."""
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "logitreplay.cli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        code = proc.wait(timeout=RUN_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # faulthandler prints every thread's stack, then it aborts
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
        pytest.fail(f"replay did not end within {RUN_S} s; its stderr, stacks last:\n{log.read_text()[-6000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what is left of its session: the fork server, its workers
    return code, log.read_text()


def test_illegal_memory_access_is_confined_to_its_selector(tmp_path: Path) -> None:
    a = Archive.create(tmp_path / "p.zarr")
    for i in range(2):
        a.write(plugin_case(f"p{i}"))
    out = tmp_path / "r.json"
    code, err = _run(["replay", str(tmp_path / "p.zarr"), "--device", "cuda", "--selectors",
                      "reference,native,deepselect", "--selector",
                      "tests.adversarial.faulty_plugins:make_illegal_access", "--isolate", "--timeout", str(STEP_S),
                      "--warmup", "2", "--rounds", "1", "--json", str(out)], tmp_path / "stderr.log")
    assert code == 0, err[-4000:]
    report = json.loads(out.read_text())
    assert len(report["cases"]) == 2, report["notes"]
    for case in report["cases"]:
        by = {r["selector"]: r for r in case["results"]}
        assert all(by[s]["status"] == "ok" for s in ("reference", "native", "deepselect")), (by, report["notes"])
        assert by["illegal-access"]["status"] == "error", (by, report["notes"])
        assert by["illegal-access"]["reason"].startswith("CUDA context lost: "), (by, report["notes"])
    # One worker per case for the culprit: its lost context was found once on each, never again.
    lost = [n for n in report["notes"] if n.startswith("illegal-access on case")]
    assert len(lost) == 2, report["notes"]
