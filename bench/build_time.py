"""Cold build and cached load of the bundled kernels (issue #4 targets: <= 30 s and <= 1 s).

Cold: `logitreplay build-kernels` into an empty cache, wall clock of the whole command (Python start and
torch import included, as a user sees it). Cached: in a fresh process with torch already imported, the
time to find every library in the cache and load it.

    python bench/build_time.py [--arch sm_90a]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

CLI = "import sys; from logitreplay.cli import main; sys.exit(main())"
LOAD = """
import sys, time, torch
from logitreplay.selectors.cuda import build
t = time.perf_counter()
for name in build.kernel_names():
    build.load(name, sys.argv[1] if len(sys.argv) > 1 else None)
print(time.perf_counter() - t)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default=None, help="Target (default: the current device's).")
    args = ap.parse_args()
    arch = ["--arch", args.arch] if args.arch else []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, LOGITREPLAY_CACHE=cache)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", CLI, "build-kernels", *arch], check=True, env=env)
        cold = time.perf_counter() - t
        cached = float(subprocess.run([sys.executable, "-c", LOAD, *arch[1:]], check=True, env=env,
                                      capture_output=True, text=True).stdout.strip())
    print(f"cold build (all kernels, whole command): {cold:.1f} s; cached load: {cached * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
