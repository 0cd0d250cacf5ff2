"""The GPU regression check: a small fixed set of cases per bundled kernel, replayed on CUDA and compared
with `logitreplay compare` against the last committed medians of the same GPU; any ratio whose whole 95%
interval lies above 1.05 fails the check, loudly. bench/gpu_check.sh and bench/peers_gpu.sh run it first
on every GPU session, so a kernel change cannot land slower without a red line in its session's log.

    python bench/regress.py --out out/regress        # replay the cases, then compare (exit 1: slower)
    python bench/regress.py --out DIR --compare-only # compare reports already in DIR

The baseline of a suite is `bench/results/<hw>-<YYYY-MM-DD>[/...]/regress/<suite>.json`, the newest
(by the folder's date, then path) whose report timed the same GPU. To move the baseline, commit a
session's `--out` folder as `bench/results/<hw>-<date>/regress/` (the commit says why the medians moved).
Exit status: 0 every suite compared within the limit; 1 a ratio above it, a case or kernel the baseline
timed and this run did not, or a replay that failed; 2 nothing slower, but some suite had no baseline
for this GPU (commit the folder to make one).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
LIMIT = 1.05
# kernel -> suite -> case ids: ordinary rows of each width class and dtype, the indexer-like prefill and
# decode shapes, and deepselect's flooded-bin pair (its re-bet). Fixed: a change to it moves no baseline.
CASES: dict[str, dict[str, tuple[str, ...]]] = {
    "native": {
        "seed-controls": ("b-normal-c8192-r8192-k512", "c-normal-c4096-r8192-k512"),
        "seed-controls-bf16": ("a-normal-c8192-r4096-k512-bf16",),
        "indexer": ("v32-indexer-c8192-r2048-k2048",),
    },
    "deepselect": {
        "seed-controls": ("b-normal-c8192-r8192-k512", "a-normal-c51200-r4096-k512", "c-normal-c102400-r1310-k512"),
        "seed-controls-bf16": ("c-normal-c102400-r1310-k512-bf16",),
        "indexer": ("v32-indexer-c32768-r2048-k2048",),
        "stress": ("bin-flood-c163840-b33-n1-k2048-full-f16384", "bin-flood-c163840-b33-n1-k2048-full-f16385"),
    },
    "split": {
        "indexer-decode": ("v32-indexer-c163840-b8-n1-k2048-long", "v32-indexer-c163840-b64-n1-k2048-long",
                           "v32-indexer-c163840-b256-n1-k2048-long"),
        "decode-bf16": ("batch-normal-c163840-b32-n1-k512-bf16",),
    },
}
FOLDER_DATE = re.compile(r"^[\w.]+-(\d{4}-\d{2}-\d{2})$")


def plan(cases: dict[str, dict[str, tuple[str, ...]]] = CASES) -> dict[str, tuple[list[str], list[str]]]:
    """suite -> (the kernels replayed on it, its case ids): one replay per suite, each of its kernels on
    each of its cases."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    for kernel, suites in cases.items():
        for suite, ids in suites.items():
            kernels, case_ids = out.setdefault(suite, ([], []))
            kernels.append(kernel)
            case_ids.extend(i for i in ids if i not in case_ids)
    return out


def replay_command(suite: str, kernels: list[str], case_ids: list[str], out: Path) -> list[str]:
    """The replay of one suite's cases: the full-scale suite, the default CUDA protocol, --strict."""
    return ["logitreplay", "replay", "--device", "cuda", "--suite", suite, "--scale", "full",
            "--selectors", ",".join(kernels), *(a for i in case_ids for a in ("--case", i)),
            "--json", str(out / f"{suite}.json"), "--strict"]


def gpu_of(report: dict[str, Any]) -> str | None:
    return (report.get("environment") or {}).get("gpu")


def baseline(results: Path, suite: str, gpu: str | None) -> Path | None:
    """The last committed report of `suite` on `gpu`: the newest results folder (by its date, then its
    path) with a `regress/<suite>.json` whose report ran on that GPU; None when there is none."""
    found = []
    for path in results.glob(f"**/regress/{suite}.json"):
        top = path.relative_to(results).parts[0]
        m = FOLDER_DATE.match(top)
        if m is None or gpu_of(json.loads(path.read_text())) != gpu:
            continue
        found.append((m.group(1), path.relative_to(results).as_posix(), path))
    return max(found)[2] if found else None


def compare(base: Path, new: Path, limit: float) -> tuple[int, dict[str, Any]]:
    """`logitreplay compare BASE NEW --fail-above LIMIT` (its table printed), its exit status and JSON (kept
    out of the reports' folder, which a session commits as the next baseline)."""
    from logitreplay.cli import main as cli

    with tempfile.TemporaryDirectory() as tmp:
        out_json = Path(tmp) / "compare.json"
        try:
            cli.main(["compare", str(base), str(new), "--fail-above", str(limit), "--json", str(out_json)])
        except SystemExit as e:  # the command always exits: 0, or 1 with its one-line reason printed
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        else:
            code = 0
        return code, (json.loads(out_json.read_text()) if out_json.is_file() else {})


def check(out: Path, results: Path, limit: float = LIMIT,
          suites: dict[str, tuple[list[str], list[str]]] | None = None) -> tuple[int, list[str]]:
    """Compare each suite's report in `out` with its baseline: (exit status, one line per finding)."""
    lines, slower, unbased = [], False, False
    for suite in suites or plan():
        new = out / f"{suite}.json"
        if not new.is_file():
            lines.append(f"FAILED {suite}: no report {new} (its replay did not finish)")
            slower = True
            continue
        gpu = gpu_of(json.loads(new.read_text()))
        base = baseline(results, suite, gpu)
        if base is None:
            lines.append(f"NO BASELINE {suite}: no committed regress/{suite}.json timed on {gpu}; commit {out} "
                         "as bench/results/<hw>-<date>/regress/ to make one")
            unbased = True
            continue
        code, verdict = compare(base, new, limit)
        missing = verdict.get("only_base") or []
        where = base.relative_to(results).as_posix()
        if code != 0 or missing:
            slow = [f"{r['case_id']}/{r['selector']} {r['ratio']:.3f}x [{r['low']:.3f}, {r['high']:.3f}]"
                    for r in verdict.get("rows", []) if r["low"] > limit]
            lines.append(f"REGRESSION {suite} against {where}: " + "; ".join(
                [*(slow or ([] if code == 0 else [f"compare exited {code}"])),
                 *(f"{m} timed in the baseline, not now" for m in missing)]))
            slower = True
        else:
            worst = max((r["ratio"] for r in verdict.get("rows", [])), default=float("nan"))
            lines.append(f"ok {suite} against {where}: {len(verdict.get('rows', []))} ratios, worst {worst:.3f}x")
    return (1 if slower else 2 if unbased else 0), lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/regress"), help="where the reports go")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the committed results (baselines)")
    ap.add_argument("--limit", type=float, default=LIMIT, help="fail above this ratio's whole interval")
    ap.add_argument("--compare-only", action="store_true", help="compare the reports already in --out")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    failed_replays = []
    if not args.compare_only:
        commands = {}
        for suite, (kernels, case_ids) in plan().items():
            cmd = replay_command(suite, kernels, case_ids, args.out)
            commands[f"{suite}.json"] = " ".join(cmd)
            print(f"regress: {' '.join(cmd)}", flush=True)
            if subprocess.run([sys.executable, "-m", "logitreplay", *cmd[1:]]).returncode != 0:
                failed_replays.append(suite)
        (args.out / "commands.json").write_text(json.dumps(commands, indent=1) + "\n")
    status, lines = check(args.out, args.results, args.limit)
    lines += [f"FAILED {s}: its replay exited non-zero (a kernel failed verification or raised)"
              for s in failed_replays]
    status = 1 if failed_replays else status
    banner = {0: "REGRESSION CHECK PASSED", 1: "REGRESSION CHECK FAILED", 2: "REGRESSION CHECK: NO BASELINE"}[status]
    print("\n".join(["", "=" * 78, f"{banner} (limit {args.limit:g}x, bench/regress.py)", *lines, "=" * 78]),
          flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
