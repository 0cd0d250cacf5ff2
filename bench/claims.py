"""Rendered claims: every figure table of the project's documents, regenerated from the committed results
under bench/results/, so that a number in README.md, bench/RESULTS.md, bench/FIDELITY.md, bench/PEERS.md or
docs/reliability.md is never typed by hand and cannot drift from its data. Prose stays hand-written.

A rendered block in a document is the text between two marker lines:

    <!-- claims: NAME -->
    (rendered: replaced on every `make claims`)
    <!-- /claims -->

    python bench/claims.py           # rewrite every block of every document (`make claims`)
    python bench/claims.py --check   # exit 1 naming each block that differs from its data (`make claims-check`)

Registering a new table (the one step another bench script needs):
1. write a function `def my_table(root: Path) -> str` below that reads its JSON under `root / RESULTS`
   (`load`), builds the markdown (`table`), and states where it came from (`source`: the command, hardware
   and date, read from the data and the folder's commands.json), and decorate it with `@claim("my-table")`;
2. put `<!-- claims: my-table -->` and `<!-- /claims -->` on their own lines where the table goes;
3. record the command that wrote each results file in its folder's commands.json ({file: command});
4. run `make claims` and commit the document with the data.
A block whose NAME has no function, or a function no document uses, fails the check.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))  # the bench scripts whose tables these are (fidelity, reliability, ...)

import deepselect_ab  # noqa: E402
import fidelity  # noqa: E402
import heldout  # noqa: E402
import peers  # noqa: E402
import reliability  # noqa: E402
import replay_controls  # noqa: E402
import targets  # noqa: E402

from logitreplay.selectors import provenance  # noqa: E402

ROOT = BENCH.parent
RESULTS = "bench/results"
DOCUMENTS = ("README.md", "bench/RESULTS.md", "bench/FIDELITY.md", "bench/PEERS.md", "docs/reliability.md")
BLOCK = re.compile(r"^<!-- claims: (?P<name>[\w.-]+) -->\n(?P<body>.*?)^<!-- /claims -->$", re.M | re.S)
MARKER = re.compile(r"^<!-- /?claims\b.*$", re.M)

Renderer = Callable[[Path], str]
RENDERERS: dict[str, Renderer] = {}


class ClaimsError(Exception):
    """A document or its data cannot be rendered: unknown block, unterminated marker, missing record."""


def claim(name: str) -> Callable[[Renderer], Renderer]:
    """Register `fn(root) -> markdown` as the renderer of the blocks named `name`."""

    def register(fn: Renderer) -> Renderer:
        if name in RENDERERS:
            raise ClaimsError(f"claims block {name!r} registered twice")
        RENDERERS[name] = fn
        return fn

    return register


# ---- reading the data and stating where it came from ----

def load(root: Path, rel: str) -> Any:
    """A committed results file (`rel` under bench/results/), as JSON."""
    return json.loads((root / RESULTS / rel).read_text())


def run_date(rel: str) -> str:
    """The date of a run: its results folder is named `<hardware>-YYYY-MM-DD`."""
    m = re.match(r"[\w.]+-(\d{4}-\d{2}-\d{2})/", rel)
    if m is None:
        raise ClaimsError(f"{RESULTS}/{rel}: not in a results folder named <hardware>-YYYY-MM-DD")
    return m.group(1)


def recorded(root: Path, rel: str) -> dict[str, str]:
    """The folder's commands.json entry for a results file: its command, and its hardware where the file
    itself does not say (test records)."""
    folder, _, name = rel.partition("/")
    path = root / RESULTS / folder / "commands.json"
    entry = json.loads(path.read_text()).get(name) if path.is_file() else None
    if entry is None:
        raise ClaimsError(f"{RESULTS}/{rel}: no command recorded in {RESULTS}/{folder}/commands.json")
    return {"command": entry} if isinstance(entry, str) else entry


def hardware(env: dict[str, Any]) -> str:
    """The machine of a run, from a report's environment (or a bench JSON's own device fields)."""
    gpu = env.get("gpu") or env.get("device")
    parts = [f"{gpu}" + (f", {env['sm_count']} SMs" if env.get("sm_count") else "")] if gpu else []
    parts += [f"{label} {env[key]}" for key, label in (("driver", "driver"), ("cuda_runtime", "CUDA"),
                                                       ("torch", "torch")) if env.get(key)]
    return ", ".join(parts)


def source(root: Path, rel: str, env: dict[str, Any] | None = None) -> str:
    """One line naming a table's data: the file, the date and hardware of its run, the command, and
    `kernel_mark` where the kernels that made it are not the tree's."""
    entry = recorded(root, rel)
    where = entry.get("hardware") or hardware(env or {})
    return (f"Data: `{RESULTS}/{rel}` ({run_date(rel)}, {where}); command: `{entry['command']}`."
            + kernel_mark(root, rel))


# ---- which kernels made the data ----

SELECTORS = "logitreplay/selectors"  # the tree's bundled kernels and CPU models, whose digests are current
# Results no bundled kernel or CPU model made (codec speeds, the capture's overhead, copy bandwidth, test
# tallies), or made from named revisions of a kernel, each column naming its commit (ptxas's resources
# per revision, a bench/deepselect_ab.py run's folder): their tables carry no kernel mark.
KERNEL_FREE = re.compile(r"(codecs\.txt|capture_overhead\.json|copy\.json|\.xml|deepselect(-phases)?-resources\.json"
                         r"|/deepselect-ab)$")
OLDER = "**Measured on an older kernel"


def ran_sources(root: Path, rel: str) -> tuple[dict[str, str] | None, list[str]]:
    """The kernel source digests a results file recorded (None: it recorded none) and the bundled kernels
    that made it: a JSON's `environment.kernel_sources` (a replay report's kernels are those of its
    selectors), else a `kernel_sources` entry in the folder's commands.json (records written as text)."""
    path = root / RESULTS / rel
    if path.suffix == ".json":
        data = json.loads(path.read_text())
        sources = (data.get("environment") or {}).get("kernel_sources")
        selectors = data.get("selectors") if data.get("schema") == "logitreplay.replay/1" else None
        return sources, provenance.bundled_in(selectors) if selectors is not None else list(provenance.BUNDLED)
    entry: dict[str, Any] = recorded(root, rel)
    return entry.get("kernel_sources"), list(provenance.BUNDLED)


@functools.cache
def tree_digests(root: Path) -> dict[str, set[str]]:
    base = root / SELECTORS
    if not base.is_dir():
        raise ClaimsError(f"{SELECTORS}: not in {root}, so the kernels' source digests cannot be compared")
    return provenance.tree_digests(base)


def kernel_mark(root: Path, rel: str) -> str:
    """Nothing when the kernels that made `rel` have the tree's sources; otherwise a visible mark: the run
    recorded no digests (it predates them), or names each kernel whose sources have changed since."""
    if KERNEL_FREE.search(rel):
        return ""
    return stale_mark(root, *ran_sources(root, rel))


def stale_mark(root: Path, sources: dict[str, str] | None, ran: list[str]) -> str:
    """`kernel_mark` of a run that recorded `sources` (the kernels' digests) and ran the kernels `ran`."""
    if not ran:
        return ""
    if not sources:
        return f" {OLDER} / kernel sources not recorded** (the run predates their digests)."
    tree = tree_digests(root)
    stale = [k for k in ran if sources.get(k) not in tree[k]]
    if not stale:
        return ""
    what = ", ".join(f"{k} ({(sources.get(k) or 'not recorded')[:15]})" for k in stale)
    return f" {OLDER}**: the sources of {what} are not the tree's."


def protocol(report: dict[str, Any]) -> str:
    """A replay report's timing protocol in words."""
    p = report["protocol"]
    graphs = "CUDA graphs, " if p.get("graphs") else ""
    return (f"{graphs}{p['l2']} L2, {p['warmup']} warmups, {p['rounds']} alternating rounds x "
            f"{p['samples_per_round']} samples, {p['timer']} timer, medians in microseconds")


# ---- markdown ----

def table(head: Iterable[str], rows: Iterable[Iterable[str]]) -> str:
    head = list(head)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def us(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def span(values: list[float], unit: str = "x") -> str:
    """`lo-hi` of some ratios, to two decimals (one value: itself)."""
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


# ---- replay reports ----

def medians(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per case id: selector -> median us (timed results only)."""
    return {c["case_id"]: targets.timed(c) for c in report["cases"]}


def worst_cv(report: dict[str, Any]) -> float:
    return max(r["timing"]["cv"] for c in report["cases"] for r in c["results"]
               if r["status"] == "ok" and r.get("timing"))


def pair_rules(report: dict[str, Any], a: str = "native", b: str = "deepselect") -> list[Any]:
    """`replay --recommend`'s rules of one selector pair, recomputed from the report (the CLI's own code)."""
    from logitreplay.replay.recommend import recommend
    from logitreplay.replay.results import ReplayResult

    return [r for r in recommend(ReplayResult.from_json(report)) if (r.a, r.b) == (a, b)]


H200_FP32 = "h200-2026-12-02/seed-controls.json"
H200_BF16 = "h200-2026-12-02/decisions/fit-seed-controls-bf16.json"
README_CASES = ("b-normal-c8192-r8192-k512", "b-normalplus100-c8192-r8192-k512",
                "b-normaltimes1e-8-c8192-r8192-k512", "c-normal-c25600-r2048-k512", "c-normal-c102400-r1310-k512")
CONCENTRATED = ("normal+100", "normal*1e-8")


def _case_label(case: dict[str, Any]) -> str:
    return f"{case['cols']} x {case['rows']}" + ("" if case["top_k"] == 512 else f", k={case['top_k']}")


@claim("readme-h200")
def readme_h200(root: Path) -> str:
    report = load(root, H200_FP32)
    t = medians(report)
    by_id = {c["case_id"]: c for c in report["cases"]}
    rows = [[f"{_case_label(by_id[cid])} {by_id[cid]['source']}", us(by_id[cid]["floor_us"]),
             us(t[cid].get("reference")), us(t[cid].get("native")), us(t[cid].get("deepselect"))]
            for cid in README_CASES]
    return "\n".join([
        f"The same command with `--device cuda` on an H200 (full-scale suite; {protocol(report)}; "
        "`bench/RESULTS.md` has every case, the command and the date):", "",
        table(["logits cols x rows", "read floor", "masked torch.topk", "native", "deepselect"], rows), "",
        source(root, H200_FP32, report["environment"])])


@claim("readme-current")
def readme_current(root: Path) -> str:
    """README: the same cases on the tree's kernels (the H200 peers run of seed-controls beside each peer's
    current release), beside the fastest verified production kernel of that run."""
    rel = peers_rel("seed-controls")
    report = load(root, rel)
    by_id = {c["case_id"]: c for c in report["cases"]}
    rows = []
    for cid in README_CASES:
        case, t = by_id[cid], targets.timed(by_id[cid])
        name, its = targets.fastest(t, targets.production) or ("-", None)
        rows.append([f"{_case_label(case)} {case['source']}", us(case["floor_us"]), us(t.get("native")),
                     us(t.get("deepselect")), f"{us(its)} ({name})"])
    return "\n".join([
        f"The kernels in the tree, on the H200 (full-scale suite; {protocol(report)}), beside the fastest of the "
        "production kernels run with them (vLLM, FlashInfer, SGLang, sglang-kernel, cuDNN; `bench/PEERS.md`):", "",
        table(["logits cols x rows", "read floor", "native", "deepselect", "fastest production"], rows), "",
        source(root, rel, report["environment"])])


def _normal_crossing(report: dict[str, Any]) -> tuple[str, str]:
    """Where native stops and deepselect starts on normal logits, as (native's last width, deepselect's
    first), from the recommend rule of the normal-only cases."""
    (rule,) = [r for r in pair_rules(report) if r.source == "normal"]
    widths = sorted(rule.ratios)
    if rule.crossovers:
        c = rule.crossovers[-1]
        return (str(c.lower_width), str(c.upper_width)) if c.above == "deepselect" else ("", "")
    return ("", str(widths[0])) if rule.ratios[widths[0]] > 1 else (str(widths[-1]), "")


@claim("readme-rule")
def readme_rule(root: Path) -> str:
    fp32, bf16 = load(root, H200_FP32), load(root, H200_BF16)
    nat_last, ds_first = _normal_crossing(fp32)
    _, bf16_first = _normal_crossing(bf16)
    t = medians(fp32)
    slow = [t[c["case_id"]]["native"] / t[c["case_id"]]["deepselect"] for c in fp32["cases"]
            if c["source"] in CONCENTRATED]
    return (f"`replay --recommend` turns such a table into a measured dispatch rule: here native up to "
            f"{nat_last} columns and deepselect from {ds_first} on normal logits (fp32; on bf16 deepselect wins "
            f"from {bf16_first}), and deepselect wherever scores are concentrated, where native's fp16 histogram "
            f"collapses and it runs {span(slow)} slower than deepselect.")


@claim("controls")
def controls(root: Path) -> str:
    fp32, bf16 = load(root, H200_FP32), load(root, H200_BF16)
    t32, t16 = medians(fp32), medians(bf16)
    floors16 = {c["case_id"]: c["floor_us"] for c in bf16["cases"]}
    rows = []
    for c in fp32["cases"]:
        a, b = t32[c["case_id"]], t16.get(c["case_id"] + "-bf16", {})
        rows.append([f"{c['case_id'][0]}: {_case_label(c)}", c["source"], us(c["floor_us"]), us(a.get("reference")),
                     us(a.get("native")), us(a.get("deepselect")), ratio(a.get("native"), a.get("deepselect")),
                     us(floors16.get(c["case_id"] + "-bf16")), us(b.get("native")), us(b.get("deepselect")),
                     ratio(b.get("native"), b.get("deepselect"))])
    return "\n".join([
        table(["case (cols x rows)", "source", "floor fp32", "reference fp32", "native fp32", "deepselect fp32",
               "native / deepselect", "floor bf16", "native bf16", "deepselect bf16", "native / deepselect"], rows),
        "", f"Protocol: {protocol(fp32)}. Largest coefficient of variation of any timing: "
        f"{100 * max(worst_cv(fp32), worst_cv(bf16)):.1f}%.", "",
        source(root, H200_FP32, fp32["environment"]), "", source(root, H200_BF16, bf16["environment"])])


@claim("controls-rule")
def controls_rule(root: Path) -> str:
    lines = []
    for rel in (H200_FP32, H200_BF16):
        report = load(root, rel)
        lines += [f"- {r.rule}" for r in pair_rules(report)]
        t = medians(report)
        for c in report["cases"]:
            if c["source"] in CONCENTRATED:
                m = t[c["case_id"]]
                lines.append(f"- {c['case_id']}: deepselect {m['native'] / m['deepselect']:.1f}x faster than native")
    return "\n".join(lines)


@claim("controls-2026-11-29")
def controls_2026_11_29(root: Path) -> str:
    folder = "h200-2026-11-29"
    env = load(root, f"{folder}/events-1.json")["environment"]
    return "\n".join([replay_controls.report(root / RESULTS / folder), "",
                      *(source(root, f"{folder}/{name}.json", env) + "\n" for name in ("events-1", "events-2", "cupti"))
                      ]).rstrip()


@claim("capture-overhead")
def capture_overhead(root: Path) -> str:
    rel = "h200-2026-11-29/capture_overhead.json"
    d = load(root, rel)
    med, cfg = d["median_s"], d["config"]
    plain = med["plain"]
    rows = [["plain (no hooks)", f"{1e3 * plain:.2f}", "-"],
            ["armed, idle (hooks attached, policy wants nothing more)", f"{1e3 * med['armed-idle']:.2f}",
             f"+{100 * d['armed_idle_overhead']:.2f}%"],
            ["capturing every indexer call", f"{1e3 * med['capturing']:.2f}",
             f"+{100 * d['capture_extra_fraction']:.2f}%: {1e3 * d['capture_extra_on_stream_s']:.1f} ms per prefill, "
             f"{d['capture_extra_per_case_ms']:.2f} ms per case"]]
    return "\n".join([
        f"{cfg['layers']} layers, hidden {cfg['hidden']}, indexer {cfg['index_heads']} heads x {cfg['index_dim']} dims, "
        f"top-k {cfg['top_k']}; {cfg['tokens']} tokens in chunks of {cfg['chunk_size']}; {d['staged_per_round'][-1]['captured']} "
        f"cases captured per prefill ({d['staged_per_round'][-1]['bytes'] / 2**20:.0f} MiB staged), "
        f"{d['capture']['reference_mismatched_rows']} mismatched "
        f"reference rows; writer work after the forward {min(d['flush_s']):.2f}-{max(d['flush_s']):.2f} s; the hooks "
        f"on an indexer call the policy refuses: {d['hook_cost']['hooks_us']:+.1f} us on a "
        f"{d['hook_cost']['indexer_call_us']:.1f} us call.", "",
        table(["configuration", f"prefill ms (median of {cfg['rounds']})", "vs plain"], rows), "",
        source(root, rel, {"gpu": d["device"], "torch": d["torch"]})])


# ---- bench/deepselect_tune.py runs ----

def tune(root: Path, rel: str, run: str | None = None) -> tuple[dict[str, Any], dict[tuple[str, str], dict[str, Any]]]:
    """A deepselect_tune JSON (or one `run` of a file holding several) and its timings by (case, dtype)."""
    d = load(root, rel)
    d = d["runs"][run] if run else d
    return d, {(t["case"], t["dtype"]): t for t in d["timings"]}


def _cases(timings: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(case for case, _ in timings))


def deepselect_vs_upstream(root: Path, rel: str) -> str:
    d, t = tune(root, rel)
    rows = []
    for case in _cases(t):
        a, b = t[(case, "fp32")], t[(case, "bf16")]
        rows.append([a["label"], us(a["floor"]), us(a["native"]), us(a["default"]), us(a["upstream"]),
                     ratio(a["default"], a["upstream"]), us(b["default"]), us(b["upstream"]),
                     ratio(b["default"], b["upstream"]), ratio(a["default"], b["default"])])
    failures = sum(len(v) for v in d["correctness"].values()) + len(d.get("full_scale_failures") or [])
    return "\n".join([
        table(["case", "floor fp32", "native fp32", "ours fp32", "upstream fp32", "ratio", "ours bf16",
               "upstream bf16", "ratio", "bf16 speedup"], rows), "",
        f"SM clock {d['sm_clock_mhz']} MHz at the start, {d['sm_clock_mhz_end']} at the end; verification "
        f"failures: {failures}. *upstream*: upstream DeepSelect's times of issue #5 (same protocol, H200), as the "
        "script records them: quoted, not measured from this tree.", "",
        source(root, rel, d["environment"])])


for _name, _rel in (("deepselect-2026-12-01", "h200-2026-12-01/deepselect-tune.json"),
                    ("deepselect-2026-12-02", "h200-2026-12-02/deepselect-tune.json")):
    claim(_name)(functools.partial(deepselect_vs_upstream, rel=_rel))


@claim("deepselect-sweep")
def deepselect_sweep(root: Path) -> str:
    rel = "h200-2026-12-02/deepselect-sweep.json"
    d, t = tune(root, rel)
    names = list(d["variants"])
    rows = [[t[(case, "fp32")]["label"], *(f"{us(t[(case, 'fp32')][v])} / {us(t[(case, 'bf16')][v])}"
                                           for v in [*names, "native"])] for case in _cases(t)]
    builds = "; ".join(f"{v}: " + (", ".join(f"{k}={x}" for k, x in defs.items()) or "as committed")
                       for v, defs in d["variants"].items())
    return "\n".join([table(["case (fp32 / bf16)", *names, "native"], rows), "", f"Builds: {builds}.", "",
                      source(root, rel, d["environment"])])


@claim("deepselect-resources")
def deepselect_resources(root: Path) -> str:
    """The re-bet's spills: before it, with it, and the candidate that moved it out of the loop."""
    return resources_table(root, "cpu-2026-12-05/deepselect-resources.json")


@claim("deepselect-phases-resources")
def deepselect_phases_resources(root: Path) -> str:
    """DeepSelect::run split into its phases, the re-bet out of the free rounds' loop (issues 41, 43)."""
    return resources_table(root, "cpu-2026-12-05/deepselect-phases-resources.json")


def resources_table(root: Path, rel: str) -> str:
    """bench/deepselect_ab.py resources: ptxas's registers and spills per kernel class and revision."""
    d = load(root, rel)
    names = list(d["variants"])
    head = [f"{n} ({d['variants'][n]['source']['commit']})" for n in names]

    def cell(k: dict[str, int] | None) -> str:
        return "-" if k is None else f"{k['registers']} / {k['stack']} / {k['spill_stores']} / {k['spill_loads']}"

    rows = [[label, *(cell(d["variants"][n]["kernels"].get(label)) for n in names)]
            for label in d["variants"][names[0]]["kernels"]]
    return "\n".join([table(["kernel class", *head], rows), "",
                      f"Registers per thread / stack frame / spill stores / spill loads (bytes), as ptxas reports "
                      f"them for nvcc {d['nvcc']}, {d['arch']}, the bundled build's flags.", "", source(root, rel)])


# bench/deepselect_gpu.sh's run: deepselect from named revisions beside upstream DeepSelect (issue 43).
AB_RUN = "h200-2026-12-05/deepselect-ab"
AB_SUITES = ("seed-controls", "seed-controls-bf16", "indexer-decode", "stress")
AB_BASE, AB_TREE, AB_UPSTREAM = "deepselect@pre-rebet", "deepselect@tree", "deepselect-upstream"


@claim("deepselect-ab-2026-12-05")
def deepselect_ab_2026_12_05(root: Path) -> str:
    """bench/deepselect_ab.py's table of each suite: every column's median and its ratio to the kernel before
    the re-bet, and the tree's over upstream's; each revision's deepselect.cu, marked where the tree's differs."""
    lines: list[str] = []
    for suite in AB_SUITES:
        head, rows = deepselect_ab.ratios(root / RESULTS / AB_RUN / f"{suite}.json", AB_BASE, [(AB_TREE, AB_UPSTREAM)])
        lines += [f"**{suite}** (median us; xN.NN = / {AB_BASE})", "", table(head, rows), ""]
    report = load(root, f"{AB_RUN}/{AB_SUITES[0]}.json")
    built = {r["selector"]: (r["reason"] or "").partition(";")[0] for r in report["cases"][0]["results"]}
    # the tree column is the deepselect of the tree the run recorded (its sources' digests): marked as any
    # table is once those sources change, its headers and config included
    mark = stale_mark(root, report["environment"].get("kernel_sources"), ["deepselect"])
    failed = sorted({r["selector"] for c in report["cases"] for r in c["results"] if r["status"] != "ok"})
    return "\n".join([
        *lines, "Columns: " + "; ".join(f"{k}: {v}" for k, v in built.items() if k not in failed) + "." + mark,
        *([f"No time (the column failed to load): {', '.join(failed)}."] if failed else []), "",
        f"Protocol: {protocol(report)}.", source(root, AB_RUN, report["environment"])])


@claim("deepselect-decode")
def deepselect_decode(root: Path) -> str:
    rel = "h200-2026-12-02/deepselect-decode.json"
    d, t = tune(root, rel)
    rows = [[t[(case, "fp32")]["label"], *(f"{us(t[(case, 'fp32')][s])} / {us(t[(case, 'bf16')][s])}"
                                           for s in ("default", "split", "native"))] for case in _cases(t)]
    return "\n".join([table(["shape (fp32 / bf16)", "deepselect", "split", "native"], rows), "",
                      source(root, rel, d["environment"])])


# Each suite's latest peers run: its results folder.
# The runs beside each peer's current release alone (no deterministic modes but the reference column), on the
# tree's kernels: the long suites and both seed-controls suites on the H200 (issues 41, 43).
CURRENT = "h200-2026-12-05/current-releases"
PEER_SUITES = {"probe": "h200-2026-12-02", "seed-controls": CURRENT, "seed-controls-bf16": CURRENT,
               "decode": "h200-2026-12-02", "decode-bf16": "h200-2026-12-02", "stress": "h200-2026-12-05",
               "indexer": "h200-2026-12-05", "indexer-decode": "h200-2026-12-05", "long": CURRENT,
               "long-decode": CURRENT}
# bench/RESULTS.md's targets of issue 28 stay scored on the runs its prose describes (the peers without
# vLLM's columns, which bench/FIDELITY.md scores), not on each suite's latest.
TARGET_RUNS = "h200-2026-12-03/rebet"


def peers_rel(suite: str, folder: str | None = None) -> str:
    """The committed peers report of `suite` (bench/peers.py's file name) under bench/results/: in `folder`,
    else in the suite's latest run."""
    return f"{folder or PEER_SUITES[suite]}/{peers.PREFIX}{suite}.json"


def peers_table(root: Path, suite: str, folder: str | None = None) -> str:
    """bench/PEERS.md: every peer and the bundled selectors on one suite (bench/peers.py): its latest run,
    or the one in `folder`."""
    rel = peers_rel(suite, folder)
    report = load(root, rel)
    return "\n".join([peers.suite_block(report), "", f"Protocol: {protocol(report)}.",
                      source(root, rel, report["environment"])])


for _suite in PEER_SUITES:
    claim(f"peers-{_suite}")(functools.partial(peers_table, suite=_suite))
# seed-controls beside every release and deterministic mode, on the H100 lent on 2026-12-05
H100_RUNS = "h100-2026-12-05"
claim("peers-seed-controls-h100")(functools.partial(peers_table, suite="seed-controls", folder=H100_RUNS))


def target_table(root: Path, rel: str, head: list[str], score: Callable[[dict[str, Any]], Any]) -> str:
    """bench/RESULTS.md: one of bench/targets.py's tables on one replay report, its misses and source."""
    report = load(root, rel)
    rows, misses = score(report)
    return "\n".join([table(head, rows), "", "Misses: " + ("; ".join(misses) if misses else "none") + ".", "",
                      f"Protocol: {protocol(report)}.", source(root, rel, report["environment"])])


claim("target-split-decode")(functools.partial(
    target_table, rel=peers_rel("indexer-decode", TARGET_RUNS), score=targets.split_vs_production,
    head=["case", "split", "fastest production peer", "its us", "split / it"]))
CLIFFS_HEAD = ["case", "flooded values", *(f"{k} us (after / before)" for k in targets.BUNDLED_KERNELS)]
claim("target-cliffs")(functools.partial(
    target_table, rel=peers_rel("stress", TARGET_RUNS), score=targets.capacity_cliffs, head=CLIFFS_HEAD))
DET_SUITES = ("indexer-decode", "indexer", "stress")  # the suites whose latest peers run has the -det modes


@claim("peers-det-cost")
def peers_det_cost(root: Path) -> str:
    """bench/PEERS.md: what each deterministic mode costs over its default, per suite (targets.det_cost)."""
    rows, misses, sources = [], [], []
    for suite in DET_SUITES:
        rel = peers_rel(suite)
        report = load(root, rel)
        got, missed = targets.det_cost(report)
        rows += [[suite, *r] for r in got]
        misses += [f"{m} ({suite})" for m in missed]
        sources.append(source(root, rel, report["environment"]))
    head = ["suite", "deterministic mode", "cases", "its time / default: least / median / most",
            f"within {targets.DET_TARGET}x", "us it adds"]
    return "\n".join([table(head, rows), "", "Misses of the bundled modes: " + ("; ".join(misses) or "none") + ".",
                      "", *sources])


# `auto` by the committed rule, replayed beside its selectors on each of issue 28's suites.
AUTO_RUNS = "h200-2026-12-03/rebet"
AUTO_SUITES = ("stress", "indexer", "indexer-decode")
AUTO_HEAD = ["case", "auto chose", "decided by", "fastest", "auto / fastest"]
for _suite in AUTO_SUITES:
    claim(f"target-auto-{_suite}")(functools.partial(
        target_table, rel=f"{AUTO_RUNS}/auto-{_suite}.json", score=targets.auto_vs_fastest, head=AUTO_HEAD))
# The peers runs of the tree after deepselect's split into phases (issues 41, 43): the fastest bundled kernel
# against every production peer with the read floor, and `auto` by the same committed rule beside them.
PHASES_RUNS = "h200-2026-12-05"
UPSTREAM_HEAD = ["case", "dtype", "deepselect", "deepselect-upstream", "deepselect / upstream"]
WAVES_HEAD = ["case", "rows", "valid keys (M)", "split's items", "items per block", "split us",
              "fastest production us", "split / it"]
FLOOR_HEAD = ["case", "read floor", "fastest bundled", "its us", "fastest production", "its us", "bundled / it",
              "bundled / floor"]
claim("target-decode-2026-12-05")(functools.partial(
    target_table, rel=peers_rel("indexer-decode", PHASES_RUNS), score=targets.bundled_vs_production, head=FLOOR_HEAD))
# seed-controls beside every peer, on the H100 lent on 2026-12-05 (bench/PEERS.md's section).
claim("target-seed-controls-h100")(functools.partial(
    target_table, rel=peers_rel("seed-controls", H100_RUNS), score=targets.bundled_vs_production, head=FLOOR_HEAD))
claim("deepselect-upstream-h100")(functools.partial(
    target_table, rel=peers_rel("seed-controls", H100_RUNS), score=targets.deepselect_vs_upstream, head=UPSTREAM_HEAD))
claim("split-waves-2026-12-05")(functools.partial(
    target_table, rel=peers_rel("indexer-decode", PHASES_RUNS),
    score=functools.partial(targets.split_waves, suite="indexer-decode"),
    head=WAVES_HEAD))
# The long suites and seed-controls beside each peer's current release, on the H200 (CURRENT): the fastest
# bundled kernel against every production kernel with the read floor, bundled against upstream DeepSelect,
# split's waves on the 2^20-column decode batches, the flooded-bin pairs at 2^20 columns, and `auto` by the
# committed rule (fitted before these suites existed: every case is out of sample) on both runs.
for _suite in ("long", "long-decode", "seed-controls", "seed-controls-bf16"):
    claim(f"target-{_suite}-h200")(functools.partial(
        target_table, rel=peers_rel(_suite), score=targets.bundled_vs_production, head=FLOOR_HEAD))
    claim(f"deepselect-upstream-{_suite}-h200")(functools.partial(
        target_table, rel=peers_rel(_suite), score=targets.deepselect_vs_upstream, head=UPSTREAM_HEAD))
claim("deepselect-upstream-indexer-h200")(functools.partial(
    target_table, rel=peers_rel("indexer"), score=targets.deepselect_vs_upstream, head=UPSTREAM_HEAD))
@claim("deepselect-dtypes-h200")
def deepselect_dtypes(root: Path) -> str:
    """bench/RESULTS.md: per seed-controls case, the bundled deepselect's and upstream DeepSelect's time in fp32
    and in bf16 (half the bytes) from the same H200 run, and each one's bf16 / fp32: how far each kernel's
    time follows the bytes it reads (issue 43's bf16 miss, measured without upstream's work counters)."""
    fp32, bf16 = peers_rel("seed-controls"), peers_rel("seed-controls-bf16")
    reports = load(root, fp32), load(root, bf16)
    first = {c["case_id"]: targets.timed(c) for c in reports[0]["cases"]}
    rows = []
    for case in reports[1]["cases"]:
        t, f = targets.timed(case), first.get(case["case_id"].removesuffix("-bf16"), {})
        cells = []
        for k in ("deepselect", "deepselect-upstream"):
            if k not in t or k not in f:
                break
            cells += [us(f[k]), us(t[k]), f"{t[k] / f[k]:.2f}"]
        else:
            rows.append([case["case_id"].removesuffix("-bf16"), *cells])
    head = ["case", "deepselect fp32", "bf16", "bf16 / fp32", "upstream fp32", "bf16", "bf16 / fp32"]
    return "\n".join([table(head, rows), "", source(root, fp32, reports[0]["environment"]),
                      source(root, bf16, reports[1]["environment"])])


claim("split-waves-long-decode")(functools.partial(
    target_table, rel=peers_rel("long-decode"), score=functools.partial(targets.split_waves, suite="long-decode"),
    head=WAVES_HEAD))
claim("target-cliffs-long-decode")(functools.partial(
    target_table, rel=peers_rel("long-decode"), score=targets.capacity_cliffs, head=CLIFFS_HEAD))
for _suite in ("long", "long-decode"):
    claim(f"target-auto-{_suite}")(functools.partial(
        target_table, rel=peers_rel(_suite), score=targets.auto_vs_fastest, head=AUTO_HEAD))
    claim(f"target-auto-{_suite}-second")(functools.partial(
        target_table, rel=f"{CURRENT}/second-{_suite}.json", score=targets.auto_vs_fastest, head=AUTO_HEAD))
for _suite in AUTO_SUITES:
    claim(f"target-auto-{_suite}-2026-12-05")(functools.partial(
        target_table, rel=peers_rel(_suite, PHASES_RUNS), score=targets.auto_vs_fastest, head=AUTO_HEAD))


@claim("auto-heldout")
def auto_heldout(root: Path) -> str:
    """bench/RESULTS.md: `auto` on decisions.HELD_OUT's cases by the rule refitted without them
    (bench/heldout.py), labelled, unlabeled, and as a label-reading dispatch saw an unlabeled case."""
    rel = f"{heldout.FOLDER}/rule.json"
    cases = sum(len(heldout.decisions.HELD_OUT[s]) for s in heldout.RUNS)
    return "\n".join([
        f"Held out: {cases} cases of seven suites (`decisions.HELD_OUT`), scored on the committed H200 timings "
        "(2026-12-03 and the 2026-12-05 third runs for stress, indexer and indexer-decode; 2026-12-02 and the "
        "2026-12-01 second runs for seed-controls and decode): nothing here was replayed.", "",
        *heldout.table(root / RESULTS), "",
        f"Within 3%: chosen / fastest of the rule's kernels timed in that run <= {heldout.NEAR_BEST}.",
        source(root, rel)])


@claim("auto-heldout-tree")
def auto_heldout_tree(root: Path) -> str:
    """bench/RESULTS.md: the same held-out split refitted with the tree's kernels' timings where they exist
    (stress, indexer, indexer-decode of 2026-12-05), scored as `auto-heldout` is."""
    rel = f"{heldout.TREE_FOLDER}/rule.json"
    return "\n".join([*heldout.table(root / RESULTS, heldout.TREE_FOLDER, heldout.TREE_RUNS), "",
                      f"Within 3%: chosen / fastest of the rule's kernels timed in that run <= {heldout.NEAR_BEST}.",
                      source(root, rel)])


@claim("auto-heldout-long")
def auto_heldout_long(root: Path) -> str:
    """bench/RESULTS.md: the tree's split refitted with the long suites' peers runs beside the tree's reports,
    scored on the held-out cases of every suite's runs (the long suites' second run included) beside the
    committed rule (bench/peers.py's AUTO_RULE) on the same cases."""
    rel = f"{heldout.LONG_FOLDER}/rule.json"
    suites = heldout.LONG_RUNS
    miss = "v32-indexer-c1048576-r128-k2048"  # in the fit (decisions.HELD_OUT says why)
    seen = [(a, b) for a, b in zip(*(heldout.score(root / RESULTS, heldout.LONG_FOLDER, {"long": suites["long"]},
                                                   rule, {miss}) for rule in (None, heldout.COMMITTED)),
                                   strict=True)]
    return "\n".join([
        f"Held out: {sum(len(heldout.decisions.HELD_OUT[s]) for s in suites)} cases of {len(suites)} suites "
        "(`decisions.HELD_OUT`), in the runs of `auto-heldout-tree` and both H200 runs of the long suites "
        f"(2026-12-05); committed: `{heldout.COMMITTED}`, fitted in sample on the seven older suites' cases, "
        "held-out ones included, and on no long case.", "",
        *heldout.versus(root / RESULTS), "",
        f"In the fit, not held out: {miss}, " + "; ".join(
            f"`{a.run}` refit {a.chosen['labelled']} {a.ratio['labelled']:.2f}x, committed "
            f"{b.chosen['labelled']} {b.ratio['labelled']:.2f}x" for a, b in seen) + ".",
        f"Within 3%: chosen / fastest of the rule's kernels timed in that run <= {heldout.NEAR_BEST}.",
        source(root, rel)])


# A split sweep table: columns (header, file, run or None, variant); `ref` is the best vLLM decode kernel of
# the stored replay, which the script records as `upstream`.
SplitColumns = list[tuple[str, str, str | None, str]]
SPLIT_TABLES: dict[str, tuple[SplitColumns, str | None]] = {
    "split-tune": ([(v, "h200-2026-12-01/split-tune.json", None, v)
                    for v in ("k64", "c2", "c4_s1", "u8", "t256", "t1024", "default")], "fp32"),
    "split-coarse": ([("before", "h200-2026-12-01/split-tune.json", None, "default"),
                      ("last part", "h200-2026-12-01/split-coarse-tune.json", "last-part-finishes", "default"),
                      ("together", "h200-2026-12-01/split-coarse-tune.json", "parts-resolve-together", "default"),
                      ("final", "h200-2026-12-01/split-coarse-tune.json", "final", "default")], None),
    "split-finish": ([("items >= 4096", "h200-2026-12-01/split-finish-tune.json", None, "m4k"),
                      ("together", "h200-2026-12-01/split-finish-tune.json", None, "together"),
                      ("final", "h200-2026-12-01/split-finish-tune.json", None, "default")], None),
}


def split_table(root: Path, name: str) -> str:
    columns, only = SPLIT_TABLES[name]
    runs = {(rel, run): tune(root, rel, run) for _, rel, run, _ in columns}
    last_rel, last_run = columns[-1][1], columns[-1][2]
    d, ref = runs[(last_rel, last_run)]
    rows = []
    for case, dtype in ref:
        if only and dtype != only:
            continue
        cells = [runs[(rel, run)][1][(case, dtype)][v] for _, rel, run, v in columns]
        upstream = ref[(case, dtype)]["upstream"]
        rows.append([ref[(case, dtype)]["label"].removeprefix("decode "), *([] if only else [dtype]), us(upstream),
                     *map(us, cells), ratio(cells[-1], upstream)])
    files = list(dict.fromkeys(rel for _, rel, _, _ in columns))
    return "\n".join([table(["shape", *([] if only else ["dtype"]), "ref", *(h for h, _, _, _ in columns),
                             f"{columns[-1][0]} / ref"], rows), "",
                      *(source(root, rel, next(v[0] for k, v in runs.items() if k[0] == rel)["environment"]) + "\n"
                        for rel in files)]).rstrip()


for _name in SPLIT_TABLES:
    claim(_name)(functools.partial(split_table, name=_name))


# ---- records written as markdown by their scripts ----

def record_table(root: Path, rel: str) -> str:
    """The table lines of a markdown record a bench script wrote, and its source."""
    lines = [x for x in (root / RESULTS / rel).read_text().splitlines() if x.startswith("|")]
    if not lines:
        raise ClaimsError(f"{RESULTS}/{rel}: no table in the record")
    return "\n".join([*lines, "", source(root, rel)])


@claim("decisions")
def decisions(root: Path) -> str:
    rel = "h200-2026-12-02/decisions/decisions.md"
    return (root / RESULTS / rel).read_text().splitlines()[0] + "\n\n" + record_table(root, rel)


# bench/deepselect_bets.py's records: the CPU model's lost bets by shape and on the flooded bins; the kernel's
# own work record (--device cuda) per case of a suite.
for _name, _rel in (("deepselect-bets", "cpu-2026-12-03/deepselect-bets.md"),
                    ("deepselect-flood", "cpu-2026-12-03/deepselect-flood.md"),
                    ("deepselect-decode-work", "h100-2026-12-05/deepselect-indexer-decode-work-kernel.md"),
                    ("deepselect-bf16-work", "h100-2026-12-05/deepselect-seed-controls-bf16-work-kernel.md"),
                    ("deepselect-long-work", "cpu-2026-12-05/deepselect-long-work.md"),
                    ("deepselect-long-decode-work", "cpu-2026-12-05/deepselect-long-decode-work.md"),
                    ("deepselect-rebet-ab-bf16", "cpu-2026-12-05/deepselect-rebet-ab-bf16.md"),
                    ("deepselect-rebet-ab-fp32", "cpu-2026-12-05/deepselect-rebet-ab-fp32.md")):
    claim(_name)(functools.partial(record_table, rel=_rel))


@claim("codecs")
def codecs(root: Path) -> str:
    """bench/codecs.py's printout (distribution, codec, ratio, encode and decode MB/s), one row per
    distribution."""
    rel = "cpu-2026-12-02/codecs.txt"
    got: dict[str, dict[str, list[str]]] = {}
    for line in (root / RESULTS / rel).read_text().splitlines()[1:]:
        dist, codec, *numbers = line.split()
        got.setdefault(dist, {})[codec] = numbers
    rows = [[dist, c["zstd-1"][0], c["blosc-lz4-bitshuffle"][0], c["zstd-1"][2], c["blosc-lz4-bitshuffle"][2]]
            for dist, c in got.items()]
    return "\n".join([table(["distribution", "Zstd-1 ratio", "Blosc lz4+bitshuffle ratio", "Zstd-1 decode MB/s",
                             "Blosc decode MB/s"], rows), "", source(root, rel)])


# ---- bench/FIDELITY.md and docs/reliability.md: their scripts' own tables ----

def fidelity_block(root: Path, folder: str, suites: tuple[str, ...]) -> str:
    """bench/fidelity.py's tables of `suites` from one results folder, and where each file came from."""
    lines, env = fidelity.tables(root / RESULTS / folder, suites)
    return "\n".join([*lines, "", *(source(root, f"{folder}/{name}", env) + "\n"
                                    for name in (*(f"{s}.json" for s in suites), "copy.json"))]).rstrip()


@claim("fidelity-decode")
def fidelity_decode(root: Path) -> str:
    return fidelity_block(root, "h200-2026-12-01", ("decode", "decode-bf16"))


# Issue 28's suites: the results folder of each one's committed `bash bench/fidelity_gpu.sh
# indexer,indexer-decode` run (its SUITE.json, copy.json and commands.json).
FIDELITY_RUNS = {"indexer": "h200-2026-12-03/fidelity", "indexer-decode": "h200-2026-12-03/fidelity"}


def fidelity_suite(root: Path, suite: str) -> str:
    return fidelity_block(root, FIDELITY_RUNS[suite], (suite,))


for _suite in FIDELITY_RUNS:
    claim(f"fidelity-{_suite}")(functools.partial(fidelity_suite, suite=_suite))


RELIABILITY = {"cpu-2026-12-02/cpu-junit.xml": False, "h200-2026-11-29/gpu-junit.xml": True}


@claim("reliability")
def reliability_table(root: Path) -> str:
    rows: dict[tuple[str, str], reliability.Tally] = {}
    for rel, gpu in RELIABILITY.items():
        rows.update(reliability.tally([root / RESULTS / rel], gpu=gpu))
    return "\n".join([reliability.table(rows), "", *(source(root, rel) + "\n" for rel in RELIABILITY)]).rstrip()


# ---- documents ----

def render_text(text: str, root: Path, where: str = "document") -> str:
    """`text` with every claims block rendered again; an unknown or unterminated block is an error."""
    ends = [m.start() for m in BLOCK.finditer(text)]
    if len(MARKER.findall(text)) != 2 * len(ends):
        raise ClaimsError(f"{where}: a claims marker without its pair (each block is `<!-- claims: NAME -->` "
                          "... `<!-- /claims -->`, each on its own line)")

    def one(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise ClaimsError(f"{where}: block {name!r} has no renderer in bench/claims.py")
        return f"<!-- claims: {name} -->\n{RENDERERS[name](root).rstrip()}\n<!-- /claims -->"

    return BLOCK.sub(one, text)


def blocks(text: str) -> list[str]:
    return [m.group("name") for m in BLOCK.finditer(text)]


def run(root: Path, check: bool) -> list[str]:
    """Render every document under `root`; with `check`, write nothing and return a diff per stale block
    (and an entry per renderer no document uses)."""
    problems: list[str] = []
    used: set[str] = set()
    for rel in DOCUMENTS:
        path = root / rel
        if not path.is_file():
            continue
        text = path.read_text()
        used.update(blocks(text))
        new = render_text(text, root, rel)
        if new == text:
            continue
        if check:
            diff = difflib.unified_diff(text.splitlines(), new.splitlines(), f"{rel} (committed)",
                                        f"{rel} (rendered from its data)", lineterm="", n=1)
            problems.append("\n".join(diff))
        else:
            path.write_text(new)
            print(f"rendered {rel}")
    problems += [f"renderer {name!r} is used by no document" for name in sorted(set(RENDERERS) - used)]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 if a document differs from its data")
    ap.add_argument("--root", type=Path, default=ROOT, help="the tree to render (default: this repository)")
    args = ap.parse_args(argv)
    try:
        problems = run(args.root, args.check)
    except (ClaimsError, OSError, KeyError, ValueError) as e:
        print(f"claims: {e}", file=sys.stderr)
        return 1
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print("claims: documents differ from their data; run `make claims` and commit", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
