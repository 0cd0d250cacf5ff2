"""Does a replay over N ranks give the single-process report, and how much sooner? One plain replay and one
`torchrun --standalone --nproc-per-node N -m logitreplay replay` with the same arguments, their reports
compared case for case (`replay.merge.differences`: everything but timings and the ranks section) and
their wall times side by side.

    python bench/distributed_check.py --nproc 1 --out out/ranks -- --suite seed-controls --strict
    python bench/distributed_check.py --nproc 8 --out out/ranks8 -- --suite stress --scale full

Exit status 1 when the reports differ (the differences are printed) or either run failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from logitreplay.replay.merge import differences
from logitreplay.replay.results import read_json


def _run(cmd: list[str]) -> tuple[int, float]:
    start = time.perf_counter()
    code = subprocess.run(cmd).returncode
    return code, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=1, help="ranks on this machine (torchrun --nproc-per-node)")
    parser.add_argument("--out", type=Path, required=True, help="folder for plain.json and ranks.json")
    parser.add_argument("replay_args", nargs=argparse.REMAINDER, help="-- then the arguments of `replay`")
    args = parser.parse_args()
    rest = args.replay_args[1:] if args.replay_args[:1] == ["--"] else args.replay_args
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    if torchrun is None:
        parser.error("torchrun is not installed")
    args.out.mkdir(parents=True, exist_ok=True)
    plain, ranks = args.out / "plain.json", args.out / "ranks.json"
    code_plain, wall_plain = _run([sys.executable, "-m", "logitreplay", "replay", *rest, "--json", str(plain)])
    code_ranks, wall_ranks = _run([torchrun, "--standalone", "--nproc-per-node", str(args.nproc), "-m", "logitreplay",
                                   "replay", *rest, "--json", str(ranks)])
    if not (plain.exists() and ranks.exists()):
        print(f"a run wrote no report (exit status {code_plain} plain, {code_ranks} torchrun)")
        return 1
    a, b = read_json(plain), read_json(ranks)
    diff = differences(a, b)
    summary = {"nproc": args.nproc, "cases": len(a.cases), "same_report": not diff, "differences": diff[:20],
               "exit_status": {"plain": code_plain, "torchrun": code_ranks},
               "wall_s": {"plain": round(wall_plain, 1), "torchrun": round(wall_ranks, 1)},
               "speedup": round(wall_plain / wall_ranks, 2),
               "ranks": [{k: r[k] for k in ("rank", "host", "device", "gpu", "lost")} | {"cases": len(r["cases"])}
                         for r in b.ranks]}
    print(json.dumps(summary, indent=1))
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if not diff and code_plain == code_ranks else 1


if __name__ == "__main__":
    sys.exit(main())
