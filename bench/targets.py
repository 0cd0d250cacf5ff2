"""The bundled kernels' targets on indexer-shaped logits, scored from one peers replay per suite
(bench/peers.py's `peers-SUITE.json`): bench/claims.py renders these tables into bench/RESULTS.md.

- `split` within DECODE_TARGET of the fastest verified production decode kernel on every `indexer-decode`
  case, and the fastest bundled kernel against it with the case's read floor (issue 41). Production here
  means every peer of the catalog but upstream DeepSelect (FlashInfer's transforms, SGLang's v2,
  sgl-kernel's fast_topk, cuDNN's indexer top-k, and vLLM's kernels in a run that staged its library;
  bench/FIDELITY.md also scores `split` against vLLM alone, bench/fidelity.py). A peer whose answer failed
  verification on a case is no competitor there. Each peer's time is its adapter's launch, including the
  copy into the replay's output where the adapter stages one (PEERS.md says which do).
- The fastest bundled kernel within FLOOR_TARGETS of the case's read floor (valid bytes over the measured
  read bandwidth): LONG_FLOOR_TARGET on every case of at least LONG_COLS columns (the `long` and
  `long-decode` suites, prefill and decode), PREFILL_FLOOR_TARGET on prefill chunks of 25,600-163,840
  columns (issue 41). A decode batch of few rows has a floor of a few microseconds or less, below any
  launch: its miss says so, and is a measurement of the launch, not of the selection.
- No bundled kernel more than CLIFF_TARGET slower one value past a capacity limit than one value before
  it: the `stress` suite's flooded-bin pairs (`...-fN` and `...-fN+1`, same rows).
- Each bundled kernel's deterministic mode (`native-det`, `deepselect-det`, `split-det`) within DET_TARGET
  of its default mode's time on every case (`det_cost`; bench/PEERS.md, beside the peers' deterministic
  calls, on the `indexer`, `indexer-decode` and `stress` runs with `--determinism`).
- `auto` within 3% of the per-case fastest bundled kernel (its rule's selectors) on >= 90% of the `stress`, `indexer`
  and `indexer-decode` cases, never above 1.10x (bench/decisions.py's targets), scored on a replay of
  `auto` beside those selectors, with the feature or width that decided each case.

    python bench/targets.py bench/results/h200-2026-12-05    # print the decode and cliff tables
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fidelity
import peers
from decisions import TARGET_SHARE, TARGET_WORST

from logitreplay.datasets import synth
from logitreplay.replay.compare import auto_vs_best
from logitreplay.replay.results import ReplayResult
from logitreplay.selectors import cpu_models
from logitreplay.selectors.auto import parse_note

DECODE_TARGET = fidelity.DECODE_TARGET  # the same target bench/FIDELITY.md scores against vLLM
CLIFF_TARGET = 1.3
# A bundled kernel's deterministic mode (`NAME-det`: lowest indices at the cutoff, rows in ascending order)
# within this of its default mode's time, case by case (issue 38).
DET_TARGET = 1.15
BUNDLED_KERNELS = ("native", "deepselect", "split")
LONG_COLS, LONG_FLOOR_TARGET = 262144, 1.3
PREFILL_COLS, PREFILL_FLOOR_TARGET = (25600, 163840), 1.5
# What a DSA decode step runs in production among the peers (the upstream DeepSelect build is a
# kernel-development reference, not a serving path on this GPU); a column `NAME@FOLDER` is NAME's.
PRODUCTION = tuple(p for p in peers.PEERS if p != "deepselect-upstream")


def production(column: str) -> bool:
    return column.partition("@")[0] in PRODUCTION
FLOOD = re.compile(r"^(?P<base>.+)-f(?P<n>\d+)$")


def timed(case: dict[str, Any]) -> dict[str, float]:
    """selector -> median us of a report case's verified, timed results."""
    return {r["selector"]: r["timing"]["median_us"] for r in case["results"]
            if r["status"] == "ok" and r.get("timing")}


def fastest(times: dict[str, float], among: Callable[[str], bool]) -> tuple[str, float] | None:
    """The fastest of the columns `among` accepts, and its time (None: no such column was timed)."""
    kept = {c: us for c, us in times.items() if among(c)}
    return min(kept.items(), key=lambda kv: kv[1]) if kept else None


def floor_target(case: dict[str, Any]) -> float | None:
    """The read-floor target of a report case (None: the case has none)."""
    if case["cols"] >= LONG_COLS:
        return LONG_FLOOR_TARGET
    lo, hi = PREFILL_COLS
    return PREFILL_FLOOR_TARGET if case.get("kind") != "decode" and lo <= case["cols"] <= hi else None


def split_vs_production(report: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Per case: split, the fastest verified production peer and its time, the ratio; and the misses."""
    rows, misses = [], []
    for case in report["cases"]:
        t = timed(case)
        rival = fastest(t, production)
        if "split" not in t or rival is None:
            continue
        best, its = rival
        r = t["split"] / its
        rows.append([case["case_id"], f"{t['split']:.1f}", best, f"{its:.1f}",
                     f"{r:.2f}" + ("" if r <= DECODE_TARGET else " **miss**")])
        if r > DECODE_TARGET:
            misses.append(f"{case['case_id']}: split {r:.2f}x {best}")
    return rows, misses


def bundled_vs_production(report: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Per case: its read floor, the fastest bundled kernel and the fastest verified production kernel with
    their times, the ratio of the two (on a decode batch, a miss above DECODE_TARGET) and the bundled
    kernel's over the floor (a miss above the case's `floor_target`)."""
    rows, misses = [], []
    for case in report["cases"]:
        t = timed(case)
        ours, rival = fastest(t, BUNDLED_KERNELS.__contains__), fastest(t, production)
        if ours is None or rival is None:
            continue
        r, f, target = ours[1] / rival[1], ours[1] / case["floor_us"], floor_target(case)
        floor_miss, rival_miss = target is not None and f > target, case.get("kind") == "decode" and r > DECODE_TARGET
        rows.append([case["case_id"], f"{case['floor_us']:.1f}", ours[0], f"{ours[1]:.1f}", rival[0],
                     f"{rival[1]:.1f}", f"{r:.2f}" + (" **miss**" if rival_miss else ""),
                     f"{f:.1f}" + (" **miss**" if floor_miss else "")])
        if rival_miss:
            misses.append(f"{case['case_id']}: {ours[0]} {r:.2f}x {rival[0]}")
        if floor_miss:
            misses.append(f"{case['case_id']}: {ours[0]} {f:.2f}x its read floor (target {target})")
    return rows, misses


def deepselect_vs_upstream(report: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Per case: the bundled `deepselect` and upstream DeepSelect (`deepselect-upstream`), both verified, and
    the ratio; a case where the bundled kernel is slower is a miss (issue 43: at or below upstream's time)."""
    rows, misses = [], []
    for case in report["cases"]:
        t = timed(case)
        if "deepselect" not in t or "deepselect-upstream" not in t:
            continue
        r = t["deepselect"] / t["deepselect-upstream"]
        rows.append([case["case_id"], case["dtype"], f"{t['deepselect']:.1f}", f"{t['deepselect-upstream']:.1f}",
                     f"{r:.2f}" + ("" if r <= 1 else " **miss**")])
        if r > 1:
            misses.append(f"{case['case_id']}: deepselect {r:.2f}x upstream")
    return rows, misses


def split_waves(report: dict[str, Any], suite: str) -> tuple[list[list[str]], list[str]]:
    """Per case of a decode suite: the items `split`'s plan cuts its rows into (cpu_models.split_plan, the
    kernel's own plan, from the case's bounds) and the items per block of the H200's grid, beside split's
    time and the fastest verified production kernel's: where a launch needs a second wave of items, a
    block loads and selects its items one after the other. Misses: split slower than that kernel."""
    recipes = {r.case_id: r for r in synth.recipes(suite, "full")}
    rows, misses = [], []
    for case in report["cases"]:
        t, recipe = timed(case), recipes.get(case["case_id"])
        rival = fastest(t, production)
        if "split" not in t or rival is None or recipe is None:
            continue
        starts, ends = synth.bounds(recipe)
        lengths = (ends - starts).astype("int64")
        items = int(cpu_models.split_plan(lengths, case["top_k"], 2 if case["dtype"] == "bfloat16" else 4).sum())
        r = t["split"] / rival[1]
        rows.append([case["case_id"], str(case["rows"]), f"{lengths.sum() / 1e6:.1f}", str(items),
                     f"{items / cpu_models.SPLIT_GRID:.2f}", f"{t['split']:.1f}", f"{rival[1]:.1f}",
                     f"{r:.2f}" + ("" if r <= 1 else " **slower**")])
        if r > 1:
            misses.append(f"{case['case_id']}: split {r:.2f}x {rival[0]}")
    return rows, misses


def capacity_cliffs(report: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Per flooded-bin pair (N and N + 1 values in the threshold bin, same rows): each bundled kernel's
    time after / before; and the misses."""
    by_id = {c["case_id"]: timed(c) for c in report["cases"]}
    rows, misses = [], []
    for cid, before in by_id.items():
        m = FLOOD.match(cid)
        after = by_id.get(f"{m['base']}-f{int(m['n']) + 1}") if m else None
        if m is None or after is None:
            continue
        cells = [cid.removeprefix("bin-flood-"), f"{m['n']} -> {int(m['n']) + 1}"]
        for k in BUNDLED_KERNELS:
            if k not in before or k not in after:
                cells.append("-")
                continue
            r = after[k] / before[k]
            cells.append(f"{before[k]:.1f} -> {after[k]:.1f} ({r:.2f})" + ("" if r <= CLIFF_TARGET else " **miss**"))
            if r > CLIFF_TARGET:
                misses.append(f"{k} on {cid}: {r:.2f}x one value past it")
        rows.append(cells)
    return rows, misses


def auto_vs_fastest(report: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Per case: auto's choice and what decided it, its ratio to the fastest of the bundled kernels;
    and the misses (a case above TARGET_WORST, or too few cases within 3%)."""
    result = ReplayResult.from_json(report)
    score = auto_vs_best(result, list(BUNDLED_KERNELS))
    rows, misses = [], []
    for case in result.cases:
        res = case.result("auto")
        if case.case_id not in score.per_case or res is None:
            continue
        ratio, best = score.per_case[case.case_id]
        chose, why = parse_note(res.reason) or ("?", "?")
        rows.append([case.case_id, chose, why, best, f"{ratio:.3f}" + ("" if ratio <= TARGET_WORST else " **miss**")])
        if ratio > TARGET_WORST:
            misses.append(f"{case.case_id}: {ratio:.2f}x {best}")
    if score.cases and score.within < TARGET_SHARE * score.cases:
        misses.append(f"within 3% on {score.within} of {score.cases} cases")
    rows.append([f"**within 3%: {score.within} of {score.cases}**", "", "", "", ""])
    return rows, misses


def det_pairs(names: list[str]) -> list[tuple[str, str]]:
    """(deterministic mode, its default) for every column `NAME-det[@FOLDER]` whose `NAME[@FOLDER]` ran
    beside it: the bundled `-det` selectors and the peers' deterministic calls (cuDNN's, FlashInfer 0.7.4's)."""
    pairs = []
    for name in names:
        base, at, folder = name.partition("@")
        default = base.removesuffix("-det") + at + folder
        if base.endswith("-det") and default in names:
            pairs.append((name, default))
    return pairs


def det_cost(report: dict[str, Any]) -> tuple[list[list[str]], list[str]]:
    """Per deterministic mode: the cases timed in both modes, its time over the default's (least, median,
    most), how many cases are within DET_TARGET, and the microseconds it adds (least to most); and the
    misses of the bundled modes (a peer's deterministic call has no target of ours)."""
    by_case = [timed(c) for c in report["cases"]]
    rows, misses = [], []
    for det, default in det_pairs(list(report["selectors"])):
        both = [(t[det], t[default]) for t in by_case if det in t and default in t]
        if not both:
            continue
        ratios = sorted(d / b for d, b in both)
        extra = [d - b for d, b in both]
        within = sum(1 for r in ratios if r <= DET_TARGET)
        rows.append([det, str(len(both)), f"{ratios[0]:.2f} / {statistics.median(ratios):.2f} / {ratios[-1]:.2f}",
                     f"{within} of {len(both)}", f"{min(extra):.1f} to {max(extra):.1f}"])
        if det.removesuffix("-det") in BUNDLED_KERNELS and within < len(both):
            misses.append(f"{det}: {len(both) - within} of {len(both)} cases above {DET_TARGET}x")
    return rows, misses


def main() -> None:
    folder = Path(sys.argv[1])
    for suite, fn in (("indexer-decode", split_vs_production), ("indexer-decode", bundled_vs_production),
                      ("stress", capacity_cliffs)):
        rows, misses = fn(json.loads((folder / f"{peers.PREFIX}{suite}.json").read_text()))
        print(f"{suite}:", *("  " + " | ".join(r) for r in rows), f"  misses: {misses or 'none'}", sep="\n")


if __name__ == "__main__":
    main()
