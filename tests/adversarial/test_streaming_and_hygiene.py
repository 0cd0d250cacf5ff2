"""Replay holds one case at a time (an archive larger than memory replays), and nothing the toolkit
reads can execute code: no pickle anywhere, attributes are JSON."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from logitreplay.archive import Archive, Case

_PEAK = """
import resource, sys
from logitreplay.cli import main
try:
    main(["replay", sys.argv[1], "--selectors", "reference", "--rounds", "1"])
except SystemExit:
    pass
print("PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _peak_rss_kib(archive: Path) -> int:
    res = subprocess.run([sys.executable, "-c", _PEAK, str(archive)], capture_output=True, text=True, timeout=600)
    line = next(x for x in res.stdout.splitlines() if x.startswith("PEAK"))
    return int(line.split()[1])


def test_replay_memory_does_not_grow_with_the_archive(tmp_path: Path) -> None:
    rows, cols = 256, 16384  # 16 MiB of float32 per case
    gen = torch.Generator().manual_seed(0)
    one, many = Archive.create(tmp_path / "one.zarr"), Archive.create(tmp_path / "many.zarr")
    n = 16
    for i in range(n):
        case = Case.from_matrix(f"c{i:02d}", torch.randn(rows, cols, generator=gen),
                                np.zeros(rows, np.int32), np.full(rows, cols, np.int32), top_k=64)
        many.write(case)
        if i == 0:
            one.write(case)
    total_kib = n * rows * cols * 4 // 1024
    growth = _peak_rss_kib(tmp_path / "many.zarr") - _peak_rss_kib(tmp_path / "one.zarr")
    # Holding every case would add the whole archive (256 MiB); streaming adds at most noise.
    assert growth < total_kib // 4, f"peak RSS grew by {growth} KiB replaying {total_kib} KiB of cases"


def test_no_code_path_can_unpickle() -> None:
    root = Path(__file__).resolve().parents[2] / "logitreplay"
    offenders = []
    for path in root.rglob("*.py"):
        text = path.read_text()
        for pattern in (r"\bimport pickle\b", r"\bfrom pickle\b", r"\bcloudpickle\b", r"\bdill\b",
                        r"allow_pickle\s*=\s*True", r"torch\.load\((?![^)]*weights_only\s*=\s*True)"):
            if re.search(pattern, text):
                offenders.append(f"{path.relative_to(root)}: {pattern}")
    assert offenders == []
