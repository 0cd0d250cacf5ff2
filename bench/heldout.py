"""`auto` out of sample: the rule refitted without decisions.HELD_OUT's cases (`decisions.py --hold-out --fit`),
scored on those cases in the reports it was fitted from and in the other committed runs of the same suites
(a second run of each; a third, of the tree after deepselect's split into phases, for stress, indexer and
indexer-decode), each case three ways:

- **labelled**: the case's kind as the report recorded it (a decode suite's cases carry `kind: decode`);
- **unlabeled**: the label stripped, the kind read off the case's bounds (archive/shape.py), as `auto`
  dispatches a case made by `Case.from_matrix`, a safetensors import or an unlabeling tool;
- **unlabeled, label only**: the label stripped and nothing inferred, every case a prefill chunk: what
  `auto` did with such a case before it read the bounds.

A case's score is the chosen kernel's median over the fastest of the rule's kernels timed on it in that run
(the reports' own timings; nothing is replayed). bench/claims.py renders `table` into bench/RESULTS.md, and
`versus`: the refit with the long suites (issue 41) beside the committed rule on the same held-out cases.
Each table scores the suites of its own runs (`RUNS`, `TREE_RUNS`, `LONG_RUNS`), so the suites added to
`decisions.HELD_OUT` after a rule was fitted leave that rule's table as it was.

    python bench/heldout.py        # print the tables
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import decisions

from logitreplay.archive.shape import infer
from logitreplay.datasets import synth
from logitreplay.replay.recommend import NEAR_BEST, ratio_to_best
from logitreplay.replay.results import CaseResult, ReplayResult
from logitreplay.selectors.auto import DispatchRule

RESULTS = Path(__file__).resolve().parent / "results"
FOLDER = "h200-2026-12-03/rebet/auto-heldout"  # the refitted rule.json, its fit.md and the features cache
# suite -> the report the rule was fitted from, then the other committed runs of the suite it is scored on
TODAY = "h200-2026-12-05"  # the peers runs of the tree after deepselect's split into phases
RUNS: dict[str, tuple[str, ...]] = {
    "seed-controls": ("h200-2026-12-02/seed-controls.json", "h200-2026-12-02/peers-seed-controls.json"),
    "seed-controls-bf16": ("h200-2026-12-02/decisions/fit-seed-controls-bf16.json",
                           "h200-2026-12-02/peers-seed-controls-bf16.json"),
    "stress": ("h200-2026-12-03/rebet/peers-stress.json", "h200-2026-12-03/rebet/auto-stress.json",
               f"{TODAY}/peers-stress.json"),
    "indexer": ("h200-2026-12-03/rebet/peers-indexer.json", "h200-2026-12-03/rebet/auto-indexer.json",
                f"{TODAY}/peers-indexer.json"),
    "indexer-decode": ("h200-2026-12-03/rebet/peers-indexer-decode.json",
                       "h200-2026-12-03/rebet/auto-indexer-decode.json", f"{TODAY}/peers-indexer-decode.json"),
    "decode": ("h200-2026-12-02/peers-decode.json", "h200-2026-12-01/decode.json"),
    "decode-bf16": ("h200-2026-12-02/peers-decode-bf16.json", "h200-2026-12-01/decode-bf16.json"),
}
# The same split refitted on the tree's kernels: the 2026-12-05 runs of stress, indexer and indexer-decode
# (deepselect in phases) in place of the re-bet's, which become its second and third runs.
TREE_FOLDER = f"{TODAY}/auto-heldout"
TREE_RUNS = {**RUNS, **{s: (runs[2], *runs[:2]) for s, runs in RUNS.items() if len(runs) == 3}}
# The tree's split with the long suites added (issue 41): fitted on their peers runs beside the tree's reports,
# scored on those and on the second run of the bundled kernels alone, beside the committed rule (`COMMITTED`,
# bench/peers.py's AUTO_RULE, which saw no long case) on the same cases.
LONG = f"{TODAY}/current-releases"
LONG_FOLDER = f"{LONG}/auto-heldout-long"
LONG_RUNS = {**TREE_RUNS, **{s: (f"{LONG}/peers-{s}.json", f"{LONG}/second-{s}.json") for s in ("long", "long-decode")}}
COMMITTED = "h200-2026-12-03/rebet/auto-fit/rule.json"
MODES = ("labelled", "unlabeled", "unlabeled, label only")


@dataclass
class Scored:
    """One held-out case of one run: per mode, the kernel chosen and chosen / fastest."""

    suite: str
    run: str
    case_id: str
    kind: str
    chosen: dict[str, str]
    ratio: dict[str, float]


def kinds(case: CaseResult, recipe: synth.Recipe) -> dict[str, str]:
    """The kind `auto` dispatches the case as, per mode."""
    starts, ends = synth.bounds(recipe)
    return {"labelled": case.kind, "unlabeled": infer(starts, ends, case.cols, case.top_k).kind,
            "unlabeled, label only": "prefill"}


def score(root: Path = RESULTS, folder: str = FOLDER, runs_of: dict[str, tuple[str, ...]] = RUNS,
          rule_file: str | None = None, ids: set[str] | None = None) -> list[Scored]:
    """Every held-out case (or the cases `ids`) of the suites and runs of `runs_of`, scored in each mode under
    the rule refitted in `folder`, or under `rule_file` (under `root`) with `folder`'s features."""
    rule = DispatchRule.load(root / (rule_file or f"{folder}/rule.json"))
    cache = json.loads((root / folder / "features.json").read_text())
    out = []
    for suite, runs in runs_of.items():
        recipes = {r.case_id: r for r in synth.recipes(suite, "full")}
        for rel in runs:
            report = ReplayResult.from_json(json.loads((root / rel).read_text()))
            for case in report.cases:
                among = [n for n in rule.selectors if case.timed(n)]
                if case.case_id not in (decisions.HELD_OUT[suite] if ids is None else ids) or case.invalid \
                        or not among:
                    continue
                seen = cache[f"suite {suite} (full)/{case.case_id}"]
                chosen = {mode: rule.choose(case.dtype, kind, case.rows, case.cols, seen)[0]
                          for mode, kind in kinds(case, recipes[case.case_id]).items()}
                out.append(Scored(suite, rel, case.case_id, case.kind, chosen,
                                  {m: ratio_to_best(case, c, among) for m, c in chosen.items()}))
    return out


def _cell(rows: list[Scored], mode: str) -> str:
    ratios = [r.ratio[mode] for r in rows]
    worst = max(rows, key=lambda r: r.ratio[mode])
    return f"{sum(x <= NEAR_BEST for x in ratios)}/{len(ratios)}, worst {max(ratios):.2f}x" + (
        f" ({worst.case_id})" if max(ratios) > NEAR_BEST else "")


def table(root: Path = RESULTS, folder: str = FOLDER, runs_of: dict[str, tuple[str, ...]] = RUNS) -> list[str]:
    """The markdown: per suite and run, cases within 3% and the worst ratio in each mode; then every
    case a mode sends more than 3% from its fastest."""
    scored = score(root, folder, runs_of)
    groups: dict[tuple[str, str], list[Scored]] = {}
    for s in scored:
        groups.setdefault((s.suite, s.run), []).append(s)
    lines = ["| suite | run | " + " | ".join(f"{m}: within 3%, worst" for m in MODES) + " |",
             "|---|---|" + "---|" * len(MODES)]
    for (suite, run), rows in groups.items():
        which = ("fitted", "second", "third")[runs_of[suite].index(run)]
        lines.append(f"| {suite} | {which}: `{run}` | " + " | ".join(_cell(rows, m) for m in MODES) + " |")
    lines.append("| all | every run | " + " | ".join(_cell(scored, m) for m in MODES) + " |")
    misses = [s for s in scored if max(s.ratio.values()) > NEAR_BEST]
    lines += ["", "| case | run | kind | " + " | ".join(f"{m}: chose, ratio" for m in MODES) + " |",
              "|---|---|---|" + "---|" * len(MODES)]
    lines += [f"| {s.case_id} | `{s.run}` | {s.kind} | "
              + " | ".join(f"{s.chosen[m]}, {s.ratio[m]:.2f}x" for m in MODES) + " |" for s in misses]
    return lines


def versus(root: Path = RESULTS, folder: str = LONG_FOLDER, runs_of: dict[str, tuple[str, ...]] = LONG_RUNS,
           other: str = COMMITTED) -> list[str]:
    """The markdown: the rule refitted in `folder` beside the rule `other` on the same held-out cases, labelled
    and unlabeled, per suite and run and over every run; then every case either sends more than 3% from its
    fastest."""
    refit, kept = score(root, folder, runs_of), score(root, folder, runs_of, other)
    modes = MODES[:2]
    head = [f"{who}: {m}" for who in ("refit", "committed") for m in modes]
    groups: dict[tuple[str, str], list[tuple[Scored, Scored]]] = {}
    for a, b in zip(refit, kept, strict=True):
        groups.setdefault((a.suite, a.run), []).append((a, b))
    lines = ["| suite | run | " + " | ".join(head) + " |", "|---|---|" + "---|" * len(head)]
    for (suite, run), pairs in [*groups.items(), (("all", "every run"), list(zip(refit, kept, strict=True)))]:
        which = run if suite == "all" else f"{('fitted', 'second', 'third')[runs_of[suite].index(run)]}: `{run}`"
        lines.append(f"| {suite} | {which} | " + " | ".join(
            _cell([p[i] for p in pairs], m) for i in (0, 1) for m in modes) + " |")
    lines += ["", "| case | run | " + " | ".join(f"{h}: chose, ratio" for h in head) + " |",
              "|---|---|" + "---|" * len(head)]
    lines += [f"| {a.case_id} | `{a.run}` | " + " | ".join(f"{s.chosen[m]}, {s.ratio[m]:.2f}x" for s in (a, b)
                                                           for m in modes) + " |"
              for a, b in zip(refit, kept, strict=True) if max(a.ratio[m] for m in modes) > NEAR_BEST
              or max(b.ratio[m] for m in modes) > NEAR_BEST]
    return lines


if __name__ == "__main__":
    print("\n".join(table()))
