"""Every DSA top-k kernel a Hopper user chooses between, side by side: the peers' adapters (FlashInfer,
SGLang v2, sgl-kernel, cuDNN's indexer top-k and upstream DeepSelect where they are installed) and the
bundled selectors, one replay per suite, and bench/PEERS.md rendered from the JSON those replays write.

Besides the synth suites it replays `probe`: rows built to find the capacity of sgl-kernel's candidate
buffer. Its fast top-k bins every value by the top 8 bits of its float16 key, sends the bins above the
k-th's to the output and keeps the k-th's bin for the finer rounds in shared memory of a fixed size
(4096 entries a round in sglang 0.5.23's JIT twin `fast_topk.cuh`, the count clipped to it): past
that, candidates are dropped. A probe row holds `c` values inside one float16 bin (1 + tiny
steps, distinct up to c = 4097) and 2048 <= c, the rest far below; rows with c = 4096 fit, c > 4096 do
not.

    python bench/peers.py --out out/peers --suites seed-controls,stress,decode --scale full
    python bench/peers.py --out bench/results/h200-2026-12-02 --md bench/PEERS.md --no-run
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from logitreplay.selectors.upstream import catalog
from logitreplay.selectors.upstream.base import note_version

CLI = "import sys; from logitreplay.cli import main; sys.exit(main())"
# The bundled selectors, each beside its deterministic mode (the cost of determinism as a ratio).
BUNDLED = ("native", "native-det", "deepselect", "deepselect-det", "split", "split-det", "auto")
# Every declared adapter, in name order; a run's columns are theirs (`columns`).
PEERS = tuple(catalog.adapters())
# `auto` dispatches by the rule fitted on the H200's replays (bench/decisions.py --fit). The 2026-12-03
# rule was fitted on stress, indexer and indexer-decode too (their 2026-12-03 runs), so a new run of
# those suites re-measures the rule on the cases it was fitted on (new timings, not new cases): a test
# of the fit against run-to-run noise, not a held-out one. Run from the project root, as the commands
# above are.
AUTO_RULE = "bench/results/h200-2026-12-03/rebet/auto-fit/rule.json"
# The index sets every column is compared with (`right_table`): the bundled deterministic mode, whose
# stated policy is the lowest indices among the candidates tied at the k-th value, held to it in the same
# run by its tie policy and reruns.
REFERENCE = "native-det"
PROBE_COUNTS = (2049, 4000, 4096, 4097, 4200, 6000, 8192, 16384)
PROBE_COLS = 32768
PREFIX = "peers-"
# Seconds a replay stopped at the --deadline gets to write its partial report before it is killed.
STOP_GRACE_S = 30


def probe_cases() -> list[Any]:
    """One case per candidate count `c`: 8 rows of 32768 columns, `c` values in [1, 1.0005) (one
    float16 bin; float32 steps keep them distinct up to c = 4097), the rest normal values around -50,
    top_k 2048."""
    from logitreplay.archive import Case

    rows, out = 8, []
    rng = np.random.default_rng(2612)
    for c in PROBE_COUNTS:
        parts = []
        for _ in range(rows):
            row = (-50 + rng.standard_normal(PROBE_COLS)).astype(np.float32)
            where = rng.choice(PROBE_COLS, c, replace=False)
            row[where] = (1 + np.arange(c) * (5e-4 / c)).astype(np.float32)
            parts.append(row)
        out.append(Case.from_rows(f"probe-onebin-c{c}-r{rows}-k2048", np.concatenate(parts),
                                  np.zeros(rows, np.int32), np.full(rows, PROBE_COLS, np.int32), top_k=2048,
                                  cols=PROBE_COLS, attrs={"source": "synthetic", "distribution": f"onebin{c}"}))
    return out


def partial(report: Path) -> bool:
    """Whether `report` is a replay stopped before its last case (its JSON marked `partial`)."""
    try:
        return json.loads(report.read_text()).get("partial") is not None
    except (OSError, ValueError):
        return False


def replay(out: Path, name: str, source: list[str], selectors: str, extra: list[str],
           timeout: float | None = None) -> str:
    """Replay one suite into `out`/peers-NAME.json, or finish it where an earlier run left it partial
    (`replay --resume`, with that run's recorded options). At `timeout` the replay gets SIGTERM, on which it
    writes the cases it finished, marked partial, so that a suite longer than one run takes several."""
    report = out / f"{PREFIX}{name}.json"
    cmd = [sys.executable, "-c", CLI, "replay", *source, "--device", "cuda", "--selectors", selectors,
           *extra, "--json", str(report)]
    shown = " ".join(["logitreplay", *cmd[3:]])
    if partial(report):
        cmd = [sys.executable, "-c", CLI, "replay", "--resume", str(report)]
        print(f"{name}: resuming the partial report {report}", flush=True)
    print("$", " ".join(["logitreplay", *cmd[3:]]), flush=True)
    proc = subprocess.Popen(cmd)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            rc = proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        print(f"{name}: stopped after {timeout:.0f} s (--deadline)" +
              (": partial, the next run with this --out resumes it" if partial(report) else ""), flush=True)
    if not report.is_file():
        print(f"{name}: the replay wrote no JSON (exit status {rc})", flush=True)
    return shown


def columns(root: Path | None) -> list[str]:
    """The peers' columns: every declared adapter, once per release staged under `root` that it takes
    (`NAME@FOLDER`), and on the installed package (catalog.columns says when)."""
    return catalog.columns(catalog.staged(root))


def kept(names: tuple[str, ...], skip: str) -> list[str]:
    """`names` less those matching any of the comma-separated shell patterns in `skip`: a suite too long for
    every column (the long ones beside every release and deterministic mode) runs on the current releases
    in the time a GPU session has. The reference column (REFERENCE) is never left out."""
    patterns = [p for p in skip.split(",") if p]
    return [n for n in names if n == REFERENCE or not any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def run(args: argparse.Namespace) -> None:
    from logitreplay.archive import Archive

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    selectors = ",".join(kept((*BUNDLED, *columns(args.staged)), args.skip))
    # --determinism 5 (the default): every verified column rerun five times under load (issue 38's report
    # of each kernel: deterministic or not, beside its tie policy and agreement); 0 leaves it out, for a
    # suite whose report is about time alone, at a sixth of the verification's cost.
    extra = ["--rule", AUTO_RULE] + (["--determinism", str(args.determinism)] if args.determinism else [])
    extra += (["--rounds", str(args.rounds)] if args.rounds else []) + \
        (["--warmup", str(args.warmup)] if args.warmup is not None else [])
    commands: dict[str, str] = {}
    start = time.monotonic()
    for suite in args.suites.split(","):
        left = args.deadline - (time.monotonic() - start) if args.deadline else None
        if left is not None and left < STOP_GRACE_S + 20:
            print(f"{suite}: not run, the --deadline was reached", flush=True)
            continue
        budget = None if left is None else left - STOP_GRACE_S  # its partial report is written within the deadline
        if suite == "probe":
            archive_path = Path(args.scratch) / "probe.zarr"
            if not archive_path.exists():
                archive = Archive.create(archive_path)
                for case in probe_cases():
                    archive.write(case)
            commands[suite] = replay(out, suite, [str(archive_path)], selectors, extra, budget)
        else:
            commands[suite] = replay(out, suite, ["--suite", suite, "--scale", args.scale], selectors, extra, budget)
        # after every suite, so that a run cut short keeps the commands of what it finished
        path = out / f"{PREFIX}commands.json"
        known = json.loads(path.read_text()) if path.is_file() else {}
        path.write_text(json.dumps({**known, **commands}, indent=1))
        (out / f"{PREFIX}versions.json").write_text(json.dumps(versions(args.staged), indent=1))


def versions(root: Path | None = None) -> dict[str, str]:
    """The date, each peer's version as this process finds it (or why not): the installed package of every
    peer without a staged release, and the two its kernels are built with (cutlass, tvm_ffi); and each
    staged folder's releases."""
    import importlib

    from logitreplay.selectors.registry import split_spec
    from logitreplay.selectors.upstream.loading import folder_versions

    found = {"date": datetime.date.today().isoformat()}
    bare = [n for n in columns(root) if split_spec(n)[1] is None]
    tops = dict.fromkeys(catalog.adapters()[n].declared.release.source.top for n in bare)
    for folder in catalog.staged(root):
        found[Path(folder).name] = ", ".join(f"{d} {v}" for d, v in folder_versions(folder).items())
    for module in (*tops, "cutlass", "tvm_ffi"):
        try:
            found[module] = str(getattr(importlib.import_module(module), "__version__", "?"))
        except Exception as e:  # not staged here: say so in the report
            found[module] = f"not importable ({type(e).__name__})"
    return found


# ----------------------------------------------------------------------------------------- report

def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if r["status"] == "ok" and r.get("timing"):
        return f"{r['timing']['median_us']:.1f}"
    return {"unsupported": "n/a", "failed": "**FAIL**"}.get(r["status"], r["status"])


def _short(case_id: str) -> str:
    return case_id if len(case_id) <= 44 else case_id[:41] + "..."


def header(name: str, cases: list[dict[str, Any]]) -> str:
    """A column's header: its name, and the version of the package it ran from as its verified results'
    notes state it (Upstream.note), unless the name already says it (a staged folder's)."""
    found = dict.fromkeys(v for c in cases for r in c["results"] if r["selector"] == name and r["status"] == "ok"
                          for v in [note_version(r.get("reason") or "")] if v)
    shown = [v for v in found if v not in name]
    return f"{name} ({', '.join(shown)})" if shown else name


def suite_table(data: dict[str, Any]) -> tuple[list[str], list[str], dict[str, set[str]]]:
    """A suite's table (cases x selectors, median us), its failures (selector, case, first failing row,
    detail) and the reasons each selector declined, from one replay report."""
    cases = data["cases"]
    names = list(dict.fromkeys(r["selector"] for c in cases for r in c["results"]))
    lines = ["| case | " + " | ".join(header(n, cases) for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    fails: list[str] = []
    why: dict[str, set[str]] = {}
    for c in cases:
        by = {r["selector"]: r for r in c["results"]}
        if c.get("invalid"):
            lines.append(f"| {_short(c['case_id'])} | invalid: {c['invalid']} |")
            continue
        lines.append(f"| {_short(c['case_id'])} | " + " | ".join(_cell(by.get(n)) for n in names) + " |")
        for n, r in by.items():
            if r["status"] == "unsupported":
                why.setdefault(n, set()).add(r.get("reason") or "")
            elif r["status"] in ("failed", "error"):
                first = (r.get("failures") or [{}])[0]
                detail = first.get("detail") or r.get("reason") or ""
                row = first.get("row", "?")
                fails.append(f"- `{n}` on `{c['case_id']}`: {r['status']}, row {row}: {detail[:300]}")
    return lines, fails, why


def _determinism_cell(results: list[dict[str, Any]]) -> str:
    """`yes` when every rerun of every verified case returned the same output; else in how many cases
    only the order differed and in how many the index sets did."""
    seen = [r["determinism"] for r in results if r.get("determinism")]
    if not seen:
        return "-"
    order = sum(1 for d in seen if not d["deterministic"] and d["same_sets"])
    sets = sum(1 for d in seen if not d["same_sets"])
    if not order and not sets:
        return f"yes ({len(seen)})"
    parts = [f"order in {order}" if order else "", f"sets in {sets}" if sets else ""]
    return f"no: {', '.join(p for p in parts if p)} of {len(seen)}"


def _policy_cell(results: list[dict[str, Any]]) -> str:
    """The tie policies shown over the cases that offered a choice, each with its number of cases."""
    counts = Counter(r["tie_policy"] for r in results if r.get("tie_policy"))
    return ", ".join(f"{p} ({n})" for p, n in counts.most_common()) or "-"


def _agreement_cell(cases: list[dict[str, Any]], name: str) -> str:
    """The least fraction of a case's rows whose index set is REFERENCE's, and in how many cases it is
    below 1."""
    if name == REFERENCE:
        return "(reference)"
    found = [a["rows"] for c in cases for a in c.get("agreement") or [] if {a["a"], a["b"]} == {name, REFERENCE}]
    if not found:
        return "-"
    below = sum(1 for f in found if f < 1)
    least = math.floor(min(found) * 100) / 100  # rounded down: a case below 1 never reads 1.00
    return f"{least:.2f}" + (f" ({below} of {len(found)} below 1)" if below else "")


def _recall_cell(results: list[dict[str, Any]]) -> str:
    """The least recall (fraction of the exact top-k's values held) over the cases it failed."""
    recalls = [r["damage"]["recall_min"] for r in results if r.get("damage")]
    return f"{min(recalls):.3f} ({len(recalls)} case{'s' if len(recalls) > 1 else ''})" if recalls else "-"


def right_table(data: dict[str, Any]) -> list[str]:
    """Selector rows x what a report with `--determinism` says beyond right values (docs/design.md, issue
    38): cases verified of those it ran, cases declined, deterministic over the reruns, tie policy,
    agreement of index sets with REFERENCE, and recall where it failed. Empty for a report without reruns."""
    cases = [c for c in data["cases"] if not c.get("invalid")]
    if not any(r.get("determinism") for c in cases for r in c["results"]):
        return []
    names = list(dict.fromkeys(r["selector"] for c in cases for r in c["results"]))
    lines = [f"| selector | verified | declined | deterministic | tie policy | agrees with {REFERENCE} | "
             "recall where it failed |", "|---" * 7 + "|"]
    for n in names:
        mine = [r for c in cases for r in c["results"] if r["selector"] == n]
        ran = [r for r in mine if r["status"] != "unsupported"]
        ok = sum(1 for r in ran if r["status"] == "ok")
        lines.append(f"| {header(n, cases)} | {f'{ok} of {len(ran)}' if ran else '-'} | {len(mine) - len(ran)} | "
                     f"{_determinism_cell(mine)} | {_policy_cell(mine)} | {_agreement_cell(cases, n)} | "
                     f"{_recall_cell(mine)} |")
    return lines


RIGHT_LEGEND = ("Beyond right values, per selector over the suite's cases: *verified* of the cases it ran; "
                "*deterministic*: every one of the reruns (`--determinism`, under load) returned the output of "
                "the last timed call, else in how many cases only the order or the index sets differed; *tie "
                "policy*: which of the candidates tied at the k-th value it took, per case that offered a choice "
                f"(lowest, highest, none observed); *agrees with {REFERENCE}*: the least fraction of a case's "
                "rows whose index set is that of the bundled deterministic mode (the lowest indices among the "
                "tied candidates); *recall*: the least fraction of a row's exact top-k values it held, over "
                "the cases it failed.")


def suite_block(data: dict[str, Any]) -> str:
    """One suite's markdown: its table, what its reruns showed beyond values (where it has them), its
    failures and each adapter's declines (bench/claims.py renders it into bench/PEERS.md from the
    committed report; `report` writes it after a run)."""
    lines, fails, why = suite_table(data)
    out = ["Median us; **FAIL**: failed verification (that peer's answer was wrong); n/a: declined.", "", *lines]
    right = right_table(data)
    if right:
        out += ["", RIGHT_LEGEND, "", *right]
    if fails:
        out += ["", "Verification failures (first failing row):", "", *fails]
    if why:
        out += ["", "Declined, with the adapter's reason:", ""]
        out += [f"- `{n}`: " + "; ".join(sorted(r for r in rs if r))[:600] for n, rs in sorted(why.items())]
    return "\n".join(out)


def tables(out: Path) -> tuple[list[str], dict[str, Any]]:
    """The report body from the `peers-*.json` replays in `out`, and the environment of the last suite."""
    body: list[str] = []
    env: dict[str, Any] = {}
    path = out / f"{PREFIX}commands.json"
    for suite, command in (json.loads(path.read_text()) if path.is_file() else {}).items():
        report_path = out / f"{PREFIX}{suite}.json"
        if not report_path.is_file():
            body += [f"## {suite}", "", f"No report: `{command}` wrote none.", ""]
            continue
        data = json.loads(report_path.read_text())
        env = data.get("environment", env)
        body += [f"## {suite}", "", f"`{command}`", "", suite_block(data), ""]
    return body, env


def report(out: Path, md: Path, preamble: Path | None) -> None:
    body, env = tables(out)
    head = [preamble.read_text().rstrip(), ""] if preamble is not None and preamble.is_file() else []
    meta = out / f"{PREFIX}versions.json"
    found = json.loads(meta.read_text()) if meta.is_file() else {}
    facts = {k: env[k] for k in ("gpu", "compute_capability", "driver", "torch", "cuda_runtime") if k in env}
    md.write_text("\n".join([*head, f"Run on {found.get('date', '?')}: `{json.dumps(facts)}`; packages "
                             f"`{json.dumps({k: v for k, v in found.items() if k != 'date'})}`", "", *body]) + "\n")
    print(f"wrote {md}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="where the replays' JSON goes (and is read from)")
    ap.add_argument("--md", type=Path, default=None, help="write the report here")
    ap.add_argument("--preamble", type=Path, default=None, help="text put above the tables")
    ap.add_argument("--suites", default="probe,seed-controls,seed-controls-bf16,stress,decode,decode-bf16")
    ap.add_argument("--scale", default="full")
    ap.add_argument("--rounds", type=int, default=None, help="timing rounds (replay's --rounds)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup calls (replay's --warmup)")
    ap.add_argument("--determinism", type=int, default=5,
                    help="reruns of every verified column under load (replay's --determinism; 0: none)")
    ap.add_argument("--deadline", type=float, default=None, help="seconds for all suites: the suite still running then is stopped and written partial "
                         "(a later run with this --out resumes it), later ones are skipped")
    ap.add_argument("--scratch", default="/tmp", help="where the probe archive is written")
    ap.add_argument("--staged", type=Path, default=None,
                    help="a folder whose subfolders each hold one staged release of a peer's package "
                         "(staging/README.md): each adapter that takes it gets a column on it")
    ap.add_argument("--skip", default="", metavar="PATTERNS",
                    help="comma-separated shell patterns of columns to leave out, e.g. '*-det*,*@vllm-0.33.0' "
                         "(the reference column, native-det, always runs)")
    ap.add_argument("--no-run", action="store_true", help="only render the report from earlier JSON")
    args = ap.parse_args()
    if not args.no_run:
        run(args)
    if args.md is not None:
        report(args.out, args.md, args.preamble)


if __name__ == "__main__":
    main()
