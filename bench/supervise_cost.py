"""What supervising the replay costs (issue 30): wall time of `replay` on one case by default, with
`--isolate`, and with `--timeout 5` on a hanging plugin; and whether the CPU timings of the cells change
when the replay moved from the command's own process into a worker.

Both trees run the same commands, alternately, from a clean export of each revision (`git archive`), so
the comparison is of the code alone. Usage:

    python bench/supervise_cost.py --before REV [--after REV] [--repeats 3] [--rounds 5]

It prints one line per measurement (median over the repeats) and, for the timings, the median and the
spread of the per-cell ratio after/before of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_CASE = ["--suite", "seed-controls", "--case", "a-normal-c1024*", "--rounds", "1"]
HANG = "tests.adversarial.faulty_plugins:make_hang"


def export(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def replay(tree: Path, *args: str) -> float:
    """Seconds one `logitreplay replay` takes, run from `tree` (its package is the one imported)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "logitreplay.cli", "replay", *args], cwd=tree, check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def medians(report: Path) -> dict[tuple[str, str], float]:
    data = json.loads(report.read_text())
    return {(c["case_id"], r["selector"]): r["timing"]["median_us"] for c in data["cases"] for r in c["results"]
            if r.get("timing")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="revision without supervision")
    ap.add_argument("--after", default="HEAD", help="revision with it [HEAD]")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds of the full small suite")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {name: export(rev, Path(tmp) / name) for name, rev in (("before", args.before), ("after", args.after))}
        runs = {"one case": ONE_CASE, "one case --isolate": [*ONE_CASE, "--isolate"],
                "hanging plugin --timeout 5": [*ONE_CASE, "--selectors", "reference", "--selector", HANG,
                                               "--timeout", "5"]}
        for label, cmd in runs.items():
            walls: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.repeats):
                for name, tree in trees.items():
                    walls[name].append(replay(tree, *cmd))
            print(f"{label:28s} before {statistics.median(walls['before']):6.1f} s   after "
                  f"{statistics.median(walls['after']):6.1f} s")
        ratios: list[float] = []
        for i in range(args.repeats):
            got = {}
            for name, tree in trees.items():
                out = Path(tmp) / f"{name}{i}.json"
                replay(tree, "--suite", "seed-controls", "--rounds", str(args.rounds), "--json", str(out))
                got[name] = medians(out)
            ratios += [got["after"][k] / got["before"][k] for k in got["before"] if k in got["after"]]
        q = statistics.quantiles(ratios, n=10)
        print(f"CPU cell medians after/before over {len(ratios)} cells: median {statistics.median(ratios):.3f}, "
              f"p10 {q[0]:.3f}, p90 {q[-1]:.3f}")


if __name__ == "__main__":
    main()
