"""The full-scale seed-controls suite on a GPU, as bench/RESULTS.md reports it.

Runs `logitreplay replay --device cuda --suite seed-controls --scale full` three times (CUDA events
twice, to show repeatability; CUPTI kernel durations once, to show the two timers agree), keeps each
run's JSON, and prints a markdown table of medians next to the upstream times measured with the same
protocol on an H200 (issues #4 and #5), with the checks those issues set.

    python bench/replay_controls.py --out out/controls [--selectors reference,native,deepselect]
    python bench/replay_controls.py --out out/controls --no-run   # re-read the JSON of an earlier run
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

# Upstream on an H200, cold L2, CUDA graph (us): vLLM native prefill, torch.topk on a pre-masked matrix,
# DeepSelect fp32, and the read floor, per seed-controls case.
UPSTREAM: dict[str, tuple[float, float, float, float]] = {
    "c-normal-c4096-r8192-k512": (107.7, 543, 213.2, 16.0),
    "c-normal-c8192-r8192-k512": (147.1, 901, 261.4, 32.1),
    "c-normal-c25600-r2048-k512": (131.6, 748, 167.0, 48.1),
    "c-normal-c51200-r2048-k512": (252.7, 1306, 243.1, 98.2),
    "c-normal-c102400-r1310-k512": (319.2, 1622, 208.6, 127.4),
    "b-normalplus100-c8192-r8192-k512": (1948.1, 905, 283.2, 32.1),
    "b-normaltimes1e-8-c8192-r8192-k512": (1909.4, 901, 260.3, 32.1),
    "d-normal-c65536-r4096-k2048": (659.3, 3150, 1057.2, 248.6),
}
RUNS = {"events-1": ["--timer", "events"], "events-2": ["--timer", "events"], "cupti": ["--timer", "cupti"]}
CLI = "import sys; from logitreplay.cli import main; sys.exit(main())"


def run(out: Path, selectors: str, extra: list[str]) -> None:
    for name, args in RUNS.items():
        cmd = [sys.executable, "-c", CLI, "replay", "--device", "cuda", "--suite", "seed-controls", "--scale",
               "full", "--selectors", selectors, "--json", str(out / f"{name}.json"), *args]
        if name == "events-1":
            cmd += extra
        print("$", " ".join(["logitreplay", *cmd[3:]]), flush=True)
        rc = subprocess.run(cmd).returncode
        if not (out / f"{name}.json").is_file():
            sys.exit(f"{name}: the replay wrote no JSON (exit status {rc})")
        if rc != 0:
            # Seen with torch 2.11 after CUPTI profiling: a heap abort at interpreter exit, after the
            # JSON was complete (torch's CUPTI buffer teardown; fixed upstream later).
            print(f"{name}: exit status {rc} after writing its JSON", flush=True)


def medians(path: Path) -> tuple[dict[str, dict[str, float]], dict[str, float], dict[str, Any]]:
    """Per case: selector -> median us; per case: floor us; and the environment."""
    data = json.loads(path.read_text())
    times: dict[str, dict[str, float]] = {}
    floors: dict[str, float] = {}
    for case in data["cases"]:
        times[case["case_id"]] = {r["selector"]: r["timing"]["median_us"] for r in case["results"]
                                  if r["status"] == "ok" and r.get("timing")}
        if case.get("floor_us") is not None:
            floors[case["case_id"]] = case["floor_us"]
    return times, floors, data["environment"]


def fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def pct(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else (a / b - 1) * 100


def report(out: Path) -> str:
    """The table of bench/RESULTS.md's issue #4 section and its checks, from the three runs' JSON in `out`
    (bench/claims.py renders it into RESULTS.md)."""
    e1, floors, env = medians(out / "events-1.json")
    e2, _, _ = medians(out / "events-2.json")
    cu, _, _ = medians(out / "cupti.json")
    lines = [f"GPU: {env.get('gpu')} | driver {env.get('driver')} | CUDA {env.get('cuda_runtime', env.get('cuda'))} | "
             f"torch {env.get('torch')} | SM clock start/end {env.get('sm_clock_mhz_start')}/"
             f"{env.get('sm_clock_mhz_end')} MHz", "",
             "| case | floor | native | run 2 | cupti | upstream native | ours/upstream | reference | "
             "upstream topk | deepselect | upstream deepselect |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    worst_repeat, worst_timer = 0.0, 0.0
    for cid, t in e1.items():
        up = UPSTREAM.get(cid)
        nat, nat2, natc = t.get("native"), e2.get(cid, {}).get("native"), cu.get(cid, {}).get("native")
        for sel, m in t.items():
            r = pct(e2.get(cid, {}).get(sel), m)
            worst_repeat = max(worst_repeat, abs(r or 0))
            c = cu.get(cid, {}).get(sel)
            if m > 50 and c is not None:
                worst_timer = max(worst_timer, abs(pct(c, m) or 0))
        ratio = None if up is None or nat is None else nat / up[0]
        lines.append(f"| {cid} | {fmt(floors.get(cid))} | {fmt(nat)} | {fmt(nat2)} | {fmt(natc)} | "
                     f"{fmt(up[0] if up else None)} | {fmt(ratio, '.2f')} | {fmt(t.get('reference'))} | "
                     f"{fmt(up[1] if up else None, '.0f')} | {fmt(t.get('deepselect'))} | "
                     f"{fmt(up[2] if up else None)} |")
    lines.append("")
    normal = e1.get("b-normal-c8192-r8192-k512", {}).get("native")
    for cid in ("b-normalplus100-c8192-r8192-k512", "b-normaltimes1e-8-c8192-r8192-k512"):
        slow = e1.get(cid, {}).get("native")
        if normal and slow:
            lines.append(f"- native slowdown {cid} vs normal: {slow / normal:.1f}x (target >= 5x)")
    lines.append(f"- worst run-to-run median difference: {worst_repeat:.1f}% (target <= 3%)")
    lines.append(f"- worst events vs cupti difference over 50 us: {worst_timer:.1f}% (target <= 5%)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="Folder for the runs' JSON.")
    ap.add_argument("--selectors", default="reference,native,deepselect")
    ap.add_argument("--no-run", action="store_true", help="Only re-read the JSON of an earlier run.")
    ap.add_argument("extra", nargs="*", help="Extra replay options for the first run, e.g. -- --recommend.")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_run:
        run(args.out, args.selectors, args.extra)
    print(report(args.out))


if __name__ == "__main__":
    main()
