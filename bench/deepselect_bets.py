"""How often DeepSelect's first-round bet is lost, by distribution and shape, from the CPU model.

`cpu_models.deepselect_topk` makes deepselect.cu's decisions (its configuration, segment visit order,
first threshold at `keep_rank`, free rounds, buffer capacity, exact redo), so it says without a GPU which
rows a launch reads twice. Rows of `--rows` full-length rows per case, fp32 and bf16; the last thing
printed is a Markdown table of the share of rows redone (and the candidates per row).

`--flood` instead runs the model over the `stress` suite's flooded-bin cases (full scale: N values in one
coarse bin above every other value, at the capacities of the kernels): per case, the rows redone and the
most compactions of one row. With one block per row a launch lasts as long as its slowest row, so one
lost bet in 33 rows sets the time of the launch. `--suite SUITE` prints the same for every case of a
suite (every row of each full-scale case). `--device cuda` reads the same counters from the kernel's own
work record (its work build, `-DLR_WORK_RECORD`) instead, and says on how many rows the model agrees, so
the table is a measurement of the kernel in the tree, not a model of it.

    python bench/deepselect_bets.py [--rows 16]
    python bench/deepselect_bets.py --flood
    python bench/deepselect_bets.py --suite indexer-decode [--device cuda]
    python bench/deepselect_bets.py --suite seed-controls-bf16 --rebet-ab --rows 512

`--rebet-ab` (with `--suite`) runs the model twice on the first `--rows` rows of each case, as the kernel
is and with its re-bet turned off (`DeepSelectConfig.rebets`), and prints both side by side: the work the
re-bet adds or saves on a case, where a kernel A/B shows only the time.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import fields, replace
from unittest import mock

import numpy as np
import torch

from logitreplay.datasets import synth
from logitreplay.selectors import cpu_models
from logitreplay.selectors.cuda.kernels import DeepSelectCuda
from logitreplay.selectors.cuda.work import work_record

SHAPES = [(4096, 512), (8192, 512), (25600, 512), (102400, 512), (163840, 512), (65536, 2048), (163840, 2048)]


def distributions(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Normal scores and the shapes of scores that make a bet hard: ties, concentration, order, trends."""
    cols = x.shape[1]
    return {
        "normal": x,
        "normal+100": x + 100,
        "normal*1e-8": x * 1e-8,
        "few values": torch.round(x * 2) / 2,
        "relu": x.clamp(min=0),
        "trend 0..3": x + torch.linspace(0, 3, cols),
        "sorted": x.sort(dim=1).values,
        "constant": torch.ones_like(x),
    }


def suite_work(suite: str, flood_only: bool = False, device: str | None = None) -> None:
    """The model over every row of each full-scale case of `suite` (`flood_only`: the flooded-bin cases,
    with their flooded count): per case, the rows redone, the most compactions of one row and the mean
    candidates per row. With `device`, the counts are the kernel's work record, and a last column gives the
    rows on which the model's counts differ from it (rows shorter than k, which the kernel copies without
    counting, left out of `appended`)."""
    flood = " flooded values |" if flood_only else ""
    agree = " rows the model differs on |" if device else ""
    print(f"| case | rows |{flood} rows redone | most compactions of a row | candidates per row |{agree}")
    print("|---|---|" + ("---|" if flood else "") + "---|---|---|" + ("---|" if device else ""))
    for recipe in synth.recipes(suite, "full"):
        if flood_only and not isinstance(recipe, synth.FloodRecipe):
            continue
        case = synth.generate(recipe)
        starts, ends = torch.from_numpy(case.row_starts), torch.from_numpy(case.row_ends)
        _, model = cpu_models.deepselect_topk(case.padded(), starts, ends, case.top_k)
        counts = {f.name: np.asarray(getattr(model, f.name)) for f in fields(model)}
        differs, sel = "", case.lengths > case.top_k
        if device:
            measured = work_record(DeepSelectCuda(work=True), case, device)
            bad = np.zeros(case.rows, dtype=bool)
            for name, got in measured.items():
                bad |= (sel if name == "appended" else True) & (got != counts[name])
            counts, differs = measured, f" {int(bad.sum())} |"
        flooded = f" {recipe.flood} |" if flood_only else ""
        appended = counts["appended"][sel].mean() if sel.any() else 0.0
        print(f"| {case.case_id} | {case.rows} |{flooded} {int(counts['redone'].sum())} | "
              f"{int(counts['compactions'].max())} | {appended:.0f} |{differs}", flush=True)


def rebet_ab(suite: str, rows: int) -> None:
    """Per case of `suite` (its first `rows` rows): rows compacting at least once, rows redone and the mean
    candidates per row, from the model as the kernel is / with its re-bet off."""
    real = cpu_models.deepselect_config

    def without(*args: object, **kwargs: object) -> cpu_models.DeepSelectConfig:
        return replace(real(*args, **kwargs), rebets=False)  # type: ignore[arg-type]

    print(f"first {rows} rows of each case; model as built / with the re-bet off")
    print("| case | rows compacting | rows redone | candidates per row |")
    print("|---|---|---|---|")
    for recipe in synth.recipes(suite, "full"):
        case = synth.generate(recipe)
        n = min(rows, case.rows)
        x, starts, ends = case.padded()[:n], torch.from_numpy(case.row_starts[:n]), torch.from_numpy(case.row_ends[:n])
        _, on = cpu_models.deepselect_topk(x, starts, ends, case.top_k)
        with mock.patch.object(cpu_models, "deepselect_config", without):
            _, off = cpu_models.deepselect_topk(x, starts, ends, case.top_k)
        cells = [f"{int((np.asarray(w.compactions) > 0).sum())}" for w in (on, off)], \
            [f"{int(np.asarray(w.redone).sum())}" for w in (on, off)], \
            [f"{float(np.asarray(w.appended).mean()):.0f}" for w in (on, off)]
        print(f"| {case.case_id} | " + " | ".join(" / ".join(c) for c in cells) + " |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16, help="rows per case")
    ap.add_argument("--flood", action="store_true", help="the stress suite's flooded-bin cases instead")
    ap.add_argument("--suite", help="every case of this suite at full scale instead (e.g. indexer-decode)")
    ap.add_argument("--rebet-ab", action="store_true",
                    help="with --suite: the model as built beside the model with its re-bet off")
    ap.add_argument("--device", default=None,
                    help="with --suite or --flood: the kernel's work record on this device (cuda), not the model")
    args = ap.parse_args()
    if args.rebet_ab:
        if not args.suite:
            ap.error("--rebet-ab needs --suite")
        rebet_ab(args.suite, args.rows)
        return
    if args.flood or args.suite:
        suite_work(args.suite or "stress", flood_only=args.flood, device=args.device)
        return
    t0 = time.time()
    table: dict[str, list[str]] = {}
    for cols, top_k in SHAPES:
        x = torch.randn(args.rows, cols, generator=torch.Generator().manual_seed(cols + top_k))
        starts = torch.zeros(args.rows, dtype=torch.int32)
        ends = torch.full((args.rows,), cols, dtype=torch.int32)
        for name, values in distributions(x).items():
            cells = []
            for dtype in (torch.float32, torch.bfloat16):
                _, work = cpu_models.deepselect_topk(values.to(dtype), starts, ends, top_k)
                cells.append(f"{work.redone.mean():.0%} ({work.appended.mean() / (1 + work.redone.mean()):.0f})")
            table.setdefault(name, []).append(" / ".join(cells))
    print(f"{args.rows} rows per case, {time.time() - t0:.0f} s")
    print("\nrows redone, fp32 / bf16 (candidates per row and pass); columns: cols x top_k\n")
    print("| distribution | " + " | ".join(f"{c} k{k}" for c, k in SHAPES) + " |")
    print("|---|" + "---|" * len(SHAPES))
    for name, cells in table.items():
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
