"""The decision targets of issue 16, run end to end through the CLI on one device, and printed as a table.

1. `auto`: fit the dispatch rule on seed-controls (float32 and bf16), replay `auto` beside the selectors
   it dispatches to on `stress` (and on every capture archive given), and score it against the per-case
   fastest. Target: within 3% of the best on >= 90% of cases, never worse than 1.25x.
2. `compare` on two identical runs of seed-controls: target no case flagged, and `--fail-above 1.03`
   exits 0.
3. `compare` against native made 10% slower (`bench/slowed.py`, same name): target every native case
   flagged slower, and `--fail-above 1.03` exits 1.

    .venv/bin/python bench/decisions.py --device cuda [--capture ARCHIVE ...] [--out bench/results/decisions]

On a CPU (`--device cpu`, small scale) it checks the plumbing only: the CPU models' 3-sample wall clock
is far too noisy for the targets, and the table says so. The reports, the rule and a Markdown table for
bench/RESULTS.md are written under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from logitreplay.replay.compare import auto_vs_best
from logitreplay.replay.recommend import fit_rule
from logitreplay.replay.results import read_json

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "logitreplay.cli", *args]
    print("$ logitreplay " + " ".join(args), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    if check and done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done


def replay(out: Path, name: str, inputs: list[str], selectors: str, common: list[str], *extra: str) -> Path:
    path = out / f"{name}.json"
    cli("replay", *inputs, "--selectors", selectors, *common, *extra, "--json", str(path))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--selectors", default="native,deepselect", help="what auto dispatches to")
    ap.add_argument("--capture", action="append", default=[], help="a capture archive auto is also scored on")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decisions")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    common = ["--device", args.device]
    sel = args.selectors
    among = sel.split(",")
    started = time.time()

    # 1. fit on seed-controls (both dtypes), score auto on stress and the captures
    fit = [read_json(replay(out, f"fit-{s}", ["--suite", s], sel, common)) for s in ("seed-controls",
                                                                                     "seed-controls-bf16")]
    merged = fit[0]
    merged.cases = fit[0].cases + fit[1].cases
    rule = fit_rule(merged)
    rule.save(out / "rule.json")
    rows: list[tuple[str, str, str, bool | None]] = []
    targets = [("stress", ["--suite", "stress"])] + [(Path(c).name, [c]) for c in args.capture]
    for name, inputs in targets:
        report = read_json(replay(out, f"auto-{name}", inputs, f"auto,{sel}", common, "--rule",
                                  str(out / "rule.json")))
        score = auto_vs_best(report, among)
        share = score.within / score.cases if score.cases else 0.0
        ok = score.cases > 0 and share >= 0.9 and (score.worst_ratio or 0) <= 1.25
        rows.append((f"auto on {name} (fit on seed-controls)", ">= 90% within 3%, worst <= 1.25x",
                     f"{score.within}/{score.cases} within 3% ({share:.0%}), worst {score.worst_ratio or 0:.3f}x "
                     f"({score.worst_case})", ok))

    # 2. two identical runs
    base = out / "fit-seed-controls.json"
    again = replay(out, "again-seed-controls", ["--suite", "seed-controls"], sel, common)
    same = cli("compare", str(base), str(again), "--fail-above", "1.03", "--json", check=False)
    data = json.loads(same.stdout)
    flagged = [r for r in data["rows"] if r["flag"] != "no change"]
    worst = max(data["rows"], key=lambda r: abs(r["ratio"] - 1))
    rows.append(("compare, two identical runs", "no case flagged; --fail-above 1.03 exits 0",
                 f"{len(flagged)}/{len(data['rows'])} flagged, exit {same.returncode}, largest ratio "
                 f"{worst['ratio']:.4f}", not flagged and same.returncode == 0))

    # 3. native made 10% slower
    others = ",".join(s for s in among if s != "native") or "reference"
    slow = replay(out, "slower-native", ["--suite", "seed-controls"], others, common,
                  "--selector", "bench.slowed:native_slower")
    slower = cli("compare", str(base), str(slow), "--fail-above", "1.03", "--json", check=False)
    data = json.loads(slower.stdout)
    native = [r for r in data["rows"] if r["selector"] == "native"]
    hit = [r for r in native if r["flag"] == "slower"]
    ratios = [r["ratio"] for r in native]
    rows.append(("compare, native 10% slower", "every native case flagged slower; exits 1",
                 f"{len(hit)}/{len(native)} flagged slower, median ratio "
                 f"{statistics.median(ratios) if ratios else 0:.3f}, exit {slower.returncode}",
                 bool(native) and len(hit) == len(native) and slower.returncode == 1))

    env = fit[0].environment
    where = env.get("gpu") or env.get("cpu")
    lines = [f"decisions ({args.device}, {where}, {time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s)",
             "| validation | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {'yes' if ok else 'no'} |" for a, b, c, ok in rows]
    if args.device == "cpu":
        lines.append("CPU: wall clock of the algorithm models, 3 samples per case: checks the plumbing, not "
                     "the targets (those need the GPU protocol's 40 samples).")
    text = "\n".join(lines)
    (out / "decisions.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
