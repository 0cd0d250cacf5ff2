"""Capture next to a production server: a process killed at any moment, or a file system that refuses a
write, never costs a case that was already completed, and never reaches the model."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from logitreplay.archive import Archive

_WRITER = textwrap.dedent("""
    import json, resource, signal, sys, time, torch
    from logitreplay.capture.policy import Policy, PolicyState
    from logitreplay.capture.writer import CaptureWriter
    out, limit = sys.argv[1], int(sys.argv[2])
    if limit:  # a real refusal by the OS: writes past `limit` bytes per file fail with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    writer = CaptureWriter(out, PolicyState(Policy.parse("every")))
    for i in range(int(sys.argv[3])):
        cols = 64 if i < 4 else 65536  # four small cases, then cases whose chunks exceed the limit
        logits = torch.randn(16, cols)
        starts, ends = torch.zeros(16, dtype=torch.int64), torch.full((16,), cols)
        writer.submit(logits, starts, ends, None, top_k=8, row_stride=cols, layer_index=i, layer_name="x",
                      requests=1, attrs={})
        print(i, flush=True)
        time.sleep(0.05)  # a model's pace: the queue never fills, every case reaches the disk
    print(json.dumps(writer.close()), flush=True)
""")


def _verify_all_complete(root: Path) -> int:
    archive = Archive.open(root)
    for cid in archive.case_ids():
        archive.read(cid)  # checksums of every array, every invariant
    return len(archive.case_ids())


@pytest.mark.parametrize("seed", range(4))
def test_sigkill_at_a_random_moment_loses_no_completed_case(tmp_path: Path, seed: int) -> None:
    out = tmp_path / "cap.zarr"
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(out), "0", "1000000"], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    child.stdout.readline()  # the writer is running
    time.sleep(random.Random(seed).uniform(0.0, 0.4))
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    if out.exists():
        _verify_all_complete(out)


def test_a_refused_write_keeps_completed_cases_and_reports_one_error(tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    res = subprocess.run([sys.executable, "-c", _WRITER, str(out), str(256 * 1024), "8"], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    # The first case past the limit fails with the OS's own refusal; capture then turns itself off, so
    # the three after it are dropped unwritten and the error is reported once.
    assert summary["error"].startswith(f"writing a case of x (width 65536): OSError: [Errno {errno.EFBIG}]"), summary
    assert (summary["captured"], summary["dropped"]) == (4, {"writer_error": 1, "writer_off": 3}), summary
    assert res.stderr.count("capture disabled") == 1, res.stderr[-2000:]
    assert _verify_all_complete(out) == 4
