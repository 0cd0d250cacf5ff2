"""The decision targets, run end to end through the CLI on one device, and printed as a table.

1. `auto`: replay seed-controls (float32 and bf16), `stress`, `indexer`, `indexer-decode` and the decode
   suites with the selectors auto dispatches to, fit the rule with its distribution overrides on those
   reports (`--fit`, below), replay `auto` by that rule beside its selectors on `stress`, `indexer`,
   `indexer-decode` (and every capture archive given), and score it against the per-case fastest.
   Target: within 3% of the best on >= 90% of cases, never worse than 1.10x.
2. `compare` on two identical runs of seed-controls: target no case flagged, and `--fail-above 1.03`
   exits 0.
3. `compare` against native made 10% slower (`bench/slowed.py`, same name): target every native case
   flagged slower, and `--fail-above 1.03` exits 1.

    .venv/bin/python bench/decisions.py --device cuda [--capture ARCHIVE ...] [--out bench/results/decisions]

On a CPU (`--device cpu`, small scale) it checks the plumbing only: the CPU models' wall clock (10
samples per case, the fewest `compare` judges) is far too noisy for the targets, and the table says so. The reports, the rule and a Markdown table for
bench/RESULTS.md are written under --out.

`--fit REPORT.json ...` needs no device: it fits the rule on replay reports already made (committed GPU
runs, or this script's own), with each case's distribution features (`selectors/features.py`, from the
case itself: a built-in suite's case is regenerated from the report's recorded suite and scale, an
archive's read; cached in --out/features.json), evaluates it case by case on the `--evaluate` reports
(default: the same ones), and writes rule.json and fit.md (per suite: cases within 3%, worst ratio,
against the width rule alone; per case: the choice and the feature or width that decided it):

    R2=bench/results/h200-2026-12-02 R3=bench/results/h200-2026-12-03/rebet
    .venv/bin/python bench/decisions.py --fit $R2/seed-controls.json $R2/decisions/fit-seed-controls-bf16.json \
        $R2/peers-decode.json $R2/peers-decode-bf16.json $R3/peers-stress.json $R3/peers-indexer.json \
        $R3/peers-indexer-decode.json --out $R3/auto-fit

(A cached entry without one of the features, from before it was added, is computed again.)

`--hold-out` keeps the cases of `HELD_OUT` out of the fit and evaluates the rule on them alone: `auto`
scored on cases the rule has not seen (bench/heldout.py renders it, with unlabeled twins and a second
run, into bench/RESULTS.md):

    .venv/bin/python bench/decisions.py --hold-out --fit (the seven reports above) --out $R3/auto-heldout

With the long suites (issue 41): the seven reports (stress, indexer and indexer-decode from 2026-12-05) and
`current-releases/peers-long.json`, `current-releases/peers-long-decode.json` of 2026-12-05, out to
`h200-2026-12-05/current-releases/auto-heldout-long` (its commands.json has the command).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from logitreplay.archive import Archive
from logitreplay.datasets import synth
from logitreplay.replay.compare import MIN_SAMPLES, auto_vs_best
from logitreplay.replay.recommend import NEAR_BEST, Features, evaluate, fit_reports
from logitreplay.replay.results import ReplayResult, read_json
from logitreplay.selectors.features import FEATURES, features

ROOT = Path(__file__).resolve().parents[1]
TARGET_SHARE, TARGET_WORST = 0.9, 1.10
SCORED = ("stress", "indexer", "indexer-decode")  # the suites the targets are stated on
FIT_SUITES = ("seed-controls", "seed-controls-bf16", "stress", "indexer", "indexer-decode", "decode", "decode-bf16",
              "long", "long-decode")
# Held out of the fit with --hold-out (issue 43): a fifth to a quarter of each of the project's suites, fixed by hand to
# span each suite's widths, batches, MTP, dtypes and distributions, so that `auto` is scored on cases the
# rule never saw. Fixed: a case moved in or out changes what "held out" means, and the scores with it.
HELD_OUT: dict[str, tuple[str, ...]] = {
    "seed-controls": ("a-normal-c51200-r4096-k512", "b-normalplus100-c8192-r8192-k512", "c-normal-c25600-r2048-k512"),
    "seed-controls-bf16": ("a-normal-c102400-r4096-k512-bf16", "c-normal-c8192-r8192-k512-bf16",
                           "d-normal-c65536-r4096-k2048-bf16"),
    "stress": ("dist-ties-c16384-r1024-k512", "bf16-relu-c16384-r1024-k512-bf16", "chunk-normal-c16384-r1024-k512-requests",
               "bin-flood-c163840-b256-n1-k2048-full-f16385", "bin-flood-c163840-b33-n1-k2048-full-f6145"),
    "indexer": ("v32-indexer-c65536-r1024-k2048", "v32repeat-indexer-c32768-r2048-k2048"),
    "indexer-decode": ("v32-indexer-c163840-b32-n1-k2048-long", "v32-indexer-c163840-b128-n2-k2048-long",
                       "glm5-indexer-c163840-b256-n1-k2048-long", "v32-indexer-c163840-b256-n1-k2048-32k"),
    "decode": ("batch-normal-c163840-b8-n1-k2048", "batch-normal-c163840-b65-n1-k512",
               "batch-normal-c163840-b128-n2-k2048", "batch-normal-c163840-b32-n2-k512",
               "dist-normalplus100-c163840-b64-n1-k2048", "dist-relu-c163840-b64-n1-k2048",
               "edges-normal-c163840-b64-n2-k2048-edges"),
    "decode-bf16": ("batch-normal-c163840-b256-n1-k2048-bf16", "batch-normal-c163840-b64-n2-k512-bf16",
                    "batch-normal-c163840-b1-n1-k512-bf16", "dist-normaltimes1e-8-c163840-b256-n1-k2048-bf16"),
    # The long suites (issue 41), added after the rules above were fitted (none of those saw a long case).
    # `long`: 2 of 8, both distributions at 2^19 and 2^20 columns. v32-indexer-c1048576-r128-k2048 stays in
    # the fit: it is the one prefill chunk of the fitted reports where split is the fastest (453 us, deepselect
    # 671), so held out, no fitted case would carry what a refit must learn from it; its normal twin is held out
    # instead, where deepselect wins (307 against 455 us) and a refit that learned the v32 case too broadly
    # would miss.
    "long": ("v32-indexer-c524288-r256-k2048", "ctl-normal-c1048576-r128-k2048"),
    # `long-decode`: 7 of 29, spanning batches 8 to 256, next_n 1 and 2, k 512 to 2048, the v32, normal and
    # edges distributions, and flooded bins in a 256-row batch (deepselect's) and a 33-row one (split's).
    "long-decode": ("v32-indexer-c1048576-b8-n1-k2048-long", "v32-indexer-c1048576-b128-n2-k2048-long",
                    "ctl-normal-c1048576-b64-n1-k512-long", "ctl-normal-c1048576-b256-n1-k2048-long",
                    "edges-normal-c1048576-b64-n2-k1024-edges", "bin-flood-c1048576-b256-n1-k2048-full-f40000",
                    "bin-flood-c1048576-b33-n1-k2048-full-f6145"),
}


def held_out_ids() -> set[str]:
    return {cid for ids in HELD_OUT.values() for cid in ids}


def keep(result: ReplayResult, held: bool) -> ReplayResult:
    """The report with only its held-out cases (`held`) or only the others."""
    ids = held_out_ids()
    return dataclasses.replace(result, cases=[c for c in result.cases if (c.case_id in ids) == held])


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "logitreplay.cli", *args]
    print("$ logitreplay " + " ".join(args), flush=True)
    done = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True)
    if check and done.returncode != 0:
        sys.exit(f"failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done


def replay(out: Path, name: str, inputs: list[str], selectors: str, common: list[str], *extra: str,
           reuse: bool = False) -> Path:
    """Replay into out/NAME.json (with `reuse`, an existing one is kept: a long run resumes)."""
    path = out / f"{name}.json"
    if reuse and path.is_file():
        print(f"kept {path}", flush=True)
        return path
    cli("replay", *inputs, "--selectors", selectors, *common, *extra, "--json", str(path))
    return path


def report_inputs(result: ReplayResult) -> list[tuple[str, str] | str]:
    """What a report replayed: (suite, scale) of `suite NAME (SCALE)` entries, else archive locations."""
    out: list[tuple[str, str] | str] = []
    for entry in result.environment.get("inputs") or []:
        m = re.fullmatch(r"suite (\S+) \((\w+)\)", str(entry))
        out.append((m.group(1), m.group(2)) if m else str(entry))
    return out


def report_features(results: list[ReplayResult], cache_path: Path) -> Features:
    """Every case's features, from the case itself (regenerated from its suite, or read from its archive),
    cached by input and case id."""
    cache: dict[str, dict[str, float]] = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    out: Features = {}
    for result in results:
        wanted = {c.case_id for c in result.cases if not c.invalid}
        for entry in report_inputs(result):
            if isinstance(entry, tuple):
                where = f"suite {entry[0]} ({entry[1]})"
                known = {r.case_id: r for r in synth.recipes(*entry)}
                read = lambda cid, known=known: synth.generate(known[cid])  # noqa: E731
            else:
                where, archive = entry, Archive.open(entry)
                known = {cid: cid for cid in archive.case_ids()}
                read = lambda cid, archive=archive: archive.read(cid)  # noqa: E731
            for cid in sorted(wanted & set(known)):
                key = f"{where}/{cid}"
                if not set(FEATURES) <= set(cache.get(key, {})):  # new, or cached before a feature was added
                    print(f"features of {key}", flush=True)
                    cache[key] = features(read(cid))
                    cache_path.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
                out[cid] = cache[key]
    return out


def fit_and_evaluate(fit: list[Path], scored: list[Path], selectors: list[str], out: Path,
                     hold_out: bool = False) -> list[str]:
    """Fit the rule on the `fit` reports, evaluate it on the `scored` ones; write rule.json and fit.md and
    return fit.md's lines (see the module docstring). `hold_out`: fit without the `HELD_OUT` cases and
    evaluate on them alone."""
    fit_results = [read_json(p) for p in fit]
    scored_results = [read_json(p) for p in scored]
    feats = report_features(fit_results + scored_results, out / "features.json")
    if hold_out:
        fit_results = [keep(r, held=False) for r in fit_results]
        scored_results = [keep(r, held=True) for r in scored_results]
    rule = fit_reports(fit_results, selectors, feats)
    rule.save(out / "rule.json")
    held = f", without the {len(held_out_ids())} held-out cases" if hold_out else ""
    lines = [f"dispatch rule over {', '.join(rule.selectors)}, fitted on {len(fit)} report(s){held} "
             f"({rule.fitted_on.get('gpu') or rule.fitted_on.get('device')}; {time.strftime('%Y-%m-%d')}):",
             "", *[f"- {line}" for line in rule.describe()], "",
             "| report | cases | within 3% | worst | width rule alone: within 3%, worst | target met |",
             "|---|---|---|---|---|---|"]
    per_case = ["| report | case | chose | decided by | ratio to best |", "|---|---|---|---|---|"]
    for path, result in zip(scored, scored_results, strict=True):
        rows = [e for e in evaluate(rule, result, feats) if e.ratio is not None]
        if not rows:
            continue
        ratios = [e.ratio for e in rows if e.ratio is not None]
        width = [e.width_ratio for e in rows if e.width_ratio is not None]
        within = sum(r <= NEAR_BEST for r in ratios)
        suites = {e[0] for e in report_inputs(result) if isinstance(e, tuple)}
        met = within >= TARGET_SHARE * len(ratios) and max(ratios) <= TARGET_WORST
        lines.append(f"| {path.parent.name}/{path.name} | {len(ratios)} | {within} ({within / len(ratios):.0%}) | "
                     f"{max(ratios):.3f}x | {sum(r <= NEAR_BEST for r in width)}, {max(width):.3f}x | "
                     f"{('yes' if met else 'no') if suites & set(SCORED) else '-'} |")
        per_case += [f"| {path.name} | {e.case_id} | {e.chosen} | {e.why} | {e.ratio:.3f}x |" for e in rows]
    lines += ["", f"Targets (on {', '.join(SCORED)}): >= {TARGET_SHARE:.0%} of cases within 3% of the per-case "
              f"fastest of the rule's selectors, none above {TARGET_WORST}x. The rule is evaluated on the "
              "reports' own timings (the choice's measured time over the fastest measured)."
              + (" Out of sample: evaluated on the held-out cases alone, which the fit did not see." if hold_out
                 else " In sample: the rule was fitted on these same reports, so this scores the fit, not the "
                 "rule on cases it has not seen; a fresh replay of `auto` re-measures it."
                 if {p.resolve() for p in scored} <= {p.resolve() for p in fit} else ""), "", *per_case]
    (out / "fit.md").write_text("\n".join(lines) + "\n")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--selectors", default="native,deepselect,split", help="what auto dispatches to")
    ap.add_argument("--capture", action="append", default=[], help="a capture archive auto is also scored on")
    ap.add_argument("--fit", nargs="+", type=Path, default=None, metavar="REPORT.json",
                    help="no replay: fit the rule on these reports and evaluate it (see above)")
    ap.add_argument("--evaluate", nargs="+", type=Path, default=None, metavar="REPORT.json",
                    help="with --fit: the reports the rule is evaluated on (default: the --fit ones)")
    ap.add_argument("--hold-out", action="store_true",
                    help="with --fit: keep HELD_OUT's cases out of the fit and evaluate on them alone")
    ap.add_argument("--suites", default=",".join(FIT_SUITES), help="the suites the rule is fitted on")
    ap.add_argument("--auto-only", action="store_true", help="only the auto target (no compare runs)")
    ap.add_argument("--reuse", action="store_true", help="keep the reports already under --out (resume a run)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "decisions")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    sel = args.selectors
    among = sel.split(",")
    if args.fit:
        print("\n".join(fit_and_evaluate(args.fit, args.evaluate or args.fit, among, out, args.hold_out)))
        return
    # compare judges a ratio only on MIN_SAMPLES samples a side: the CPU models' default 3 are too few
    common = ["--device", args.device] + (["--rounds", str(MIN_SAMPLES)] if args.device == "cpu" else [])
    started = time.time()

    # 1. replay the suites with auto's selectors, fit the rule on them, then replay auto by it
    suites = args.suites.split(",")
    fitted = [replay(out, f"fit-{s}", ["--suite", s], sel, common, reuse=args.reuse) for s in suites]
    fit_and_evaluate(fitted, fitted, among, out)
    rows: list[tuple[str, str, str, bool | None]] = []
    targets = [(s, ["--suite", s]) for s in SCORED] + [(Path(c).name, [c]) for c in args.capture]
    for name, inputs in targets:
        report = read_json(replay(out, f"auto-{name}", inputs, f"auto,{sel}", common, "--rule",
                                  str(out / "rule.json"), reuse=args.reuse))
        score = auto_vs_best(report, among)
        share = score.within / score.cases if score.cases else 0.0
        ok = score.cases > 0 and share >= TARGET_SHARE and (score.worst_ratio or 0) <= TARGET_WORST
        rows.append((f"auto on {name} (fit on {len(suites)} suites)",
                     f">= {TARGET_SHARE:.0%} within 3%, worst <= {TARGET_WORST}x",
                     f"{score.within}/{score.cases} within 3% ({share:.0%}), worst {score.worst_ratio or 0:.3f}x "
                     f"({score.worst_case})", ok))

    if args.auto_only:
        print("\n".join(f"| {a} | {b} | {c} | {'yes' if ok else 'no'} |" for a, b, c, ok in rows))
        return

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

    env = read_json(fitted[0]).environment
    where = env.get("gpu") or env.get("cpu")
    lines = [f"decisions ({args.device}, {where}, {time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s)",
             "| validation | target | measured | met |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {'yes' if ok else 'no'} |" for a, b, c, ok in rows]
    if args.device == "cpu":
        lines.append(f"CPU: wall clock of the algorithm models, {MIN_SAMPLES} samples per case: checks the plumbing, "
                     "not the targets (those need the GPU protocol's 40 samples).")
    text = "\n".join(lines)
    (out / "decisions.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
