"""Capacity cliffs: each kernel's time one flooded value past a capacity against one value before it.

The `stress` suite's flooded rows (`bin-flood-*`, `synth.FloodRecipe`) hold N values in one coarse
histogram bin above everything else, at N = each kernel's capacity and N + 1 (vLLM persistent_topk's
16384, DeepSelect's candidate buffer at k 2048, split's workspace slot) and at 40000. This replays them
with the bundled kernels and vLLM 0.33's decode kernels in one run and writes, per kernel and capacity,
time(N + 1) / time(N) and time(40000) / time(16385). Target for the bundled kernels: no ratio above 1.3.

    python bench/capacity.py --lib $VLLM_LIBS/_C_stable_libtorch.abi3.so --out out/capacity
    python bench/capacity.py --out out/capacity --no-run      # from an earlier run's JSON

Without --lib only the bundled kernels run. The Markdown table for bench/RESULTS.md is written to
--out/capacity.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

CLI = "import sys; from logitreplay.cli import main; sys.exit(main())"
BUNDLED = ("native", "deepselect", "split")
VLLM = ("vllm-decode", "vllm-persistent", "vllm-cooperative")
TARGET = 1.3


def run(out: Path, lib: str | None) -> None:
    selectors = ",".join(BUNDLED + tuple(f"{n}@{lib}" for n in VLLM if lib))
    cmd = [sys.executable, "-c", CLI, "replay", "--suite", "stress", "--scale", "full", "--case", "bin-flood-*",
           "--device", "cuda", "--selectors", selectors, "--json", str(out / "capacity.json")]
    print("$ logitreplay " + " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=False)
    (out / "commands.json").write_text(json.dumps({"capacity.json": " ".join(["logitreplay", *cmd[3:]])}, indent=1))


def _times(case: dict[str, Any]) -> dict[str, float]:
    """Median us per selector (its name before any @LIB) of the ok results."""
    return {r["selector"].split("@")[0]: r["timing"]["median_us"] for r in case["results"]
            if r["status"] == "ok" and r.get("timing")}


def table(report: dict[str, Any]) -> list[str]:
    by_shape: dict[tuple[int, int], dict[str, float]] = {}
    for case in report["cases"]:
        m = re.search(r"-b(\d+)-.*-f(\d+)$", case["case_id"])
        if m:
            by_shape[(int(m.group(1)), int(m.group(2)))] = _times(case)
    names = [n for n in BUNDLED + VLLM if any(n in t for t in by_shape.values())]
    lines = ["| batch | flooded values | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    misses = []
    for batch in sorted({b for b, _ in by_shape}, reverse=True):
        floods = sorted(n for b, n in by_shape if b == batch)
        pairs = [(n, n + 1) for n in floods if n + 1 in floods] + [(n, 40000) for n in floods
                                                                   if n == 16385 and 40000 in floods]
        for lo, hi in pairs:
            a, b = by_shape[(batch, lo)], by_shape[(batch, hi)]
            cells = []
            for name in names:
                if name not in a or name not in b:
                    cells.append("-")
                    continue
                r = b[name] / a[name]
                miss = name in BUNDLED and r > TARGET
                misses += [f"{name} at batch {batch}, {lo} -> {hi}: {r:.2f}x"] if miss else []
                cells.append(f"{a[name]:.1f} -> {b[name]:.1f} ({r:.2f}x{' **miss**' if miss else ''})")
            lines.append(f"| {batch} | {lo} -> {hi} | " + " | ".join(cells) + " |")
    env = report["environment"]
    return [f"Capacity cliffs ({env.get('gpu') or report['device']}, {datetime.date.today()}): median us one flooded value before "
            f"and after each capacity (and 16385 -> 40000); target: no bundled kernel above {TARGET}x.", "",
            *lines, "", "Misses: " + ("; ".join(misses) if misses else "none.")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", default=None, help="vLLM 0.33's _C_stable_libtorch.abi3.so (its decode kernels)")
    p.add_argument("--out", type=Path, default=Path("out/capacity"))
    p.add_argument("--no-run", action="store_true", help="only the table, from --out/capacity.json")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.no_run:
        run(args.out, args.lib)
    lines = table(json.loads((args.out / "capacity.json").read_text()))
    (args.out / "capacity.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
