"""How faithful the bundled kernels are to vLLM 0.33's own, measured side by side in one run per suite.

Replays `seed-controls` and `stress` (full scale), an archive of our own distributions (concentrated,
sorted and ramp rows, masked rows, ties, k = 2048) and decode shapes, and the `decode` and `decode-bf16`
suites (full scale: width 163840, batch 1-256, next_n 1 and 2, sequence lengths mixed 1K-128K; the
`indexer` and `indexer-decode` suites likewise, as prefill and decode suites) with the
bundled `native`, `deepselect` and `split` next to vLLM 0.33's kernels loaded from the staged libraries
(`vllm-native@LIB`, the decode kernels and `vllm-auto`, `vllm-deepselect@DSLIB`), measures the adapters'
staging copy alone (same protocol), and writes bench/FIDELITY.md: per case our time, upstream's time, the
copy, ratio = ours / (upstream - copy), hardware, date, command, and every case left without a ratio.
Decode cases compare `split` (the bundled decode path) and native with the best of vLLM's decode kernels;
vLLM runs those on float32 only (its bf16 decode path, DeepSelect, has SM100 code only), so a bf16 case is
compared with the best vLLM kernel on the float32 case of the same shape, which is what production runs
there.

    python bench/fidelity.py --lib $VLLM_LIBS/_C_stable_libtorch.abi3.so --ds-lib $VLLM_LIBS/_deepselect_C.abi3.so \\
        --out out/fidelity --md bench/FIDELITY.md
    python bench/fidelity.py --out out/fidelity --md bench/FIDELITY.md --no-run   # from an earlier run's JSON
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

import numpy as np

CLI = "import sys; from logitreplay.cli import main; sys.exit(main())"
TOLERANCE = 0.05
DECODE_TARGET = 1.25  # split within 1.25x of the best vLLM decode kernel
# The suites this script replays and scores: prefill suites with native and deepselect beside vLLM's
# prefill kernel and DeepSelect, decode suites with split (and native, deepselect) beside vLLM's decode
# kernels too; `own` (our own cases, prefill and decode shapes) with the decode set.
PREFILL_SUITES = ("seed-controls", "stress", "indexer")
DECODE_SUITES = ("decode", "decode-bf16", "indexer-decode")
SUITES = (*PREFILL_SUITES, "own", *DECODE_SUITES)
# What a decode table's heading says of its suite's sequence lengths (synth.py's recipes).
DECODE_LENGTHS = {"decode": "sequence lengths mixed 1K-128K", "decode-bf16": "sequence lengths mixed 1K-128K",
                  "indexer-decode": "sequence lengths mixed 1K-160K, one batch all 32K",
                  "own": "sequence lengths 2K-128K"}
DECODE_WIDTH = 163840
# vLLM 0.33's decode kernels, whose best time is split's reference (also bench/deepselect_tune.py's).
VLLM_DECODE = ("vllm-decode", "vllm-persistent", "vllm-cooperative")


def own_cases() -> list[Any]:
    """Our own distributions (1024 x 16384 causal, k 512 unless named) and decode shapes."""
    from logitreplay.archive import Case

    rows, cols = 1024, 16384
    starts = np.zeros(rows, np.int32)
    ends = (cols - rows + np.arange(rows) + 1).astype(np.int32)
    rng = np.random.default_rng(900)
    out = []

    def add(name: str, make: Any, k: int = 512) -> None:
        parts = [make(int(e)) for e in ends]
        values = np.concatenate(parts).astype(np.float32)
        out.append(Case.from_rows(f"own-{name}-c{cols}-r{rows}-k{k}", values, starts, ends, top_k=k, cols=cols,
                                  attrs={"source": "synthetic", "distribution": name}))

    add("concentrated", lambda n: 5 + 1e-3 * rng.standard_normal(n, np.float32))
    add("sorted", lambda n: np.sort(rng.standard_normal(n, np.float32)))
    add("ramp", lambda n: np.linspace(-4, 4, n, dtype=np.float32) + 1e-4 * rng.standard_normal(n, np.float32))
    add("masked", lambda n: np.where(rng.random(n) < 0.875, -np.inf, rng.standard_normal(n, np.float32)))
    add("ties", lambda n: np.round(rng.standard_normal(n, np.float32) * 2) / 2)
    add("normal", lambda n: rng.standard_normal(n, np.float32), k=2048)
    for batch, k in ((8, 2048), (64, 2048), (65, 2048), (256, 2048), (64, 512)):
        lens = np.exp(rng.uniform(np.log(2048), np.log(131072), batch)).astype(np.int32)
        values = rng.standard_normal(int(lens.sum()), np.float32)
        attrs: dict[str, Any] = {"source": "synthetic", "distribution": "normal"}
        try:  # the decode facts (batch, next_n, seq_lens, ...), where the archive knows them
            from logitreplay.archive.decode import DecodeFacts

            facts = DecodeFacts.from_row_ends(lens, next_n=1, per_row=False, max_model_len=DECODE_WIDTH)
            attrs.update(kind="decode", decode=facts.to_json())
        except ImportError:
            pass
        out.append(Case.from_rows(f"decode-b{batch}-k{k}", values, np.zeros(batch, np.int32), lens, top_k=k,
                                  cols=DECODE_WIDTH, attrs=attrs))
    return out


def replay(out: Path, name: str, source: list[str], selectors: str) -> list[str]:
    cmd = [sys.executable, "-c", CLI, "replay", *source, "--device", "cuda", "--selectors", selectors,
           "--json", str(out / f"{name}.json")]
    shown = ["logitreplay", *cmd[3:]]
    print("$", " ".join(shown), flush=True)
    rc = subprocess.run(cmd).returncode
    if not (out / f"{name}.json").is_file():
        sys.exit(f"{name}: the replay wrote no JSON (exit status {rc})")
    return shown


def copy_costs(out: Path, shapes: set[tuple[int, int]]) -> None:
    """The adapters' staging copy alone (contiguous (rows, top_k) int32 into the strided view), same protocol."""
    import torch

    from logitreplay.replay import OutputBuffer, TimingProtocol, time_launches

    dev = torch.device("cuda")
    protocol = TimingProtocol.for_device("cuda")
    # A one-element kernel: the fixed cost of any timed graph replay, which the copy inside an adapter's
    # launch does not pay a second time.
    one = torch.zeros(1, dtype=torch.int32, device=dev)
    base = time_launches({"noop": lambda: one.fill_(0)}, dev, protocol)["noop"].median_us
    path = out / "copy.json"
    costs = json.loads(path.read_text()) if path.is_file() else {}
    for rows, k in sorted(shapes):
        scratch = torch.zeros((rows, k), dtype=torch.int32, device=dev)
        view = OutputBuffer(rows, k, dev).view
        timing = time_launches({"copy": lambda v=view, s=scratch: v.copy_(s)}, dev, protocol)["copy"]
        costs[f"{rows}x{k}"] = max(timing.median_us - base, 0.0)
    path.write_text(json.dumps(costs, indent=1))


def selectors(suite: str, lib: str, ds: str) -> str:
    """The `--selectors` of a suite's replay: the prefill set for a prefill suite, the decode set (split
    and vLLM's decode kernels added) for a decode suite and for our own cases."""
    if suite not in SUITES:
        raise ValueError(f"suite {suite!r}: this script scores {', '.join(SUITES)}")
    if suite in PREFILL_SUITES:
        return f"native,deepselect,vllm-native@{lib},vllm-deepselect@{ds}"
    return (f"split,native,deepselect,vllm-native@{lib},vllm-decode@{lib},vllm-persistent@{lib},"
            f"vllm-cooperative@{lib},vllm-auto@{lib},vllm-deepselect@{ds},flashinfer")


def as_recorded(words: list[str], lib: str, ds: str) -> str:
    """A command as commands.json records it: the libraries' folder as $VLLM_LIBS (where both share one)."""
    text = " ".join(words)
    folder = str(Path(lib).parent)
    return text.replace(folder + "/", "$VLLM_LIBS/") if folder == str(Path(ds).parent) else text


def run(args: argparse.Namespace) -> None:
    from logitreplay.archive import Archive

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    lib, ds = args.lib, args.ds_lib
    suites = args.suites.split(",")
    try:
        for suite in suites:
            selectors(suite, lib, ds)  # every suite known before the first replay
    except ValueError as e:
        sys.exit(f"fidelity.py: {e}")
    commands = {}
    for suite in suites:
        if suite == "own":
            own = Path(args.scratch) / "own.zarr"
            if not own.exists():
                archive = Archive.create(own)
                for case in own_cases():
                    archive.write(case)
            commands[f"{suite}.json"] = replay(out, "own", [str(own)], selectors(suite, lib, ds))
        else:
            commands[f"{suite}.json"] = replay(out, suite, ["--suite", suite, "--scale", "full"],
                                               selectors(suite, lib, ds))
    shapes = {(c["rows"], c["top_k"]) for name in suites
              for c in json.loads((out / f"{name}.json").read_text())["cases"]}
    copy_costs(out, shapes)
    commands["copy.json"] = ["python", "bench/fidelity.py", *sys.argv[1:]]
    # By file, as bench/claims.py reads a results folder's commands.json.
    path = out / "commands.json"
    known = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**known, **{k: as_recorded(v, lib, ds) for k, v in commands.items()}}, indent=1))


def _results(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    data = json.loads(path.read_text())
    return data["cases"], data["environment"]


def _by_prefix(case: dict[str, Any], prefix: str) -> dict[str, Any] | None:
    return next((r for r in case["results"] if r["selector"].split("@")[0] == prefix), None)


def _us(r: dict[str, Any] | None, why: dict[str, set[str]] | None = None) -> str:
    """A result's median, or what it was instead: `n/a` for unsupported (its reason collected into `why`, by
    selector, for the note under the table), the status itself for anything else (a failure stays visible)."""
    if r is None:
        return "-"
    if r["status"] == "ok" and r.get("timing"):
        return f"{r['timing']['median_us']:.1f}"
    if r["status"] == "unsupported":
        if why is not None:
            why.setdefault(r["selector"].split("@")[0], set()).add(re.sub(r"^\d+ rows: ", "", r.get("reason") or ""))
        return "n/a"
    return r["status"]


def _chose(r: dict[str, Any] | None) -> str:
    """The backend vllm-auto resolved to, read from its note ("... chose X from ...", "... runs X here ...")."""
    m = re.search(r"(?:chose|runs) (\w+)", (r or {}).get("reason") or "")
    return m.group(1) if m else "?"


def _t(r: dict[str, Any] | None) -> float | None:
    return r["timing"]["median_us"] if r is not None and r["status"] == "ok" and r.get("timing") else None


def best_decode_us(case: dict[str, Any]) -> float | None:
    """The fastest of vLLM's decode kernels on a case of a replay report (its median, copy included), or
    None where none of them ran."""
    times = [t for t in (_t(_by_prefix(case, n)) for n in VLLM_DECODE) if t is not None]
    return min(times) if times else None


def tables(out: Path, suites: tuple[str, ...] = SUITES) -> tuple[list[str], dict[str, Any]]:
    """The tables, declined reasons, ratios and misses of those of `suites` whose JSON is in `out` (with the
    adapters' copy costs, copy.json), and the environment of the last suite read. bench/claims.py renders
    them into bench/FIDELITY.md from the committed runs, a block per run; `report` writes them with a
    header after a run."""
    copy = json.loads((out / "copy.json").read_text())
    lines: list[str] = []
    misses: list[str] = []
    env: dict[str, Any] = {}
    prefill_rows = ["| suite | case | native | vLLM 0.33 top_k_per_row_prefill | copy | native / (vLLM - copy) | "
                    "deepselect | vLLM deepselect |", "|---|---|---|---|---|---|---|---|"]
    decode_rows = ["| case | split | native | deepselect | per_row decode | persistent | cooperative "
                   "| vllm-auto (chose) | copy | best vLLM | split / best | native / best |",
                   "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    why: dict[str, set[str]] = {}  # unsupported: the reasons, by selector
    best_fp32: dict[str, float] = {}  # a float32 decode case's best vLLM time, for its bf16 twin
    split_ratios: list[float] = []
    native_ratios: list[float] = []
    unscored: list[str] = []  # cases whose ratio a missing or failed result left out
    lengths: list[str] = []  # the decode suites' sequence lengths, for the heading
    for suite in (x for x in SUITES if x in suites):
        if not (out / f"{suite}.json").is_file():
            continue
        cases, env = _results(out / f"{suite}.json")
        for c in cases:
            key = f"{c['rows']}x{c['top_k']}"
            cp = copy.get(key)
            nat, up = _by_prefix(c, "native"), _by_prefix(c, "vllm-native")
            if c.get("kind") == "decode" or c["case_id"].startswith("decode-"):
                if DECODE_LENGTHS.get(suite) and DECODE_LENGTHS[suite] not in lengths:
                    lengths.append(DECODE_LENGTHS[suite])
                fastest = best_decode_us(c)
                best = fastest - cp if fastest is not None and cp is not None else None
                twin = c["case_id"].replace("-bf16", "")
                if best is not None and c["dtype"] == "float32":
                    best_fp32[twin] = best
                best = best if best is not None else best_fp32.get(twin)
                split = _by_prefix(c, "split")
                ratio = "-"
                if best and _t(split):
                    r = _t(split) / best  # type: ignore[operator]
                    split_ratios.append(r)
                    ratio = f"{r:.2f}" + ("" if r <= DECODE_TARGET else " **miss**")
                    if r > DECODE_TARGET:
                        misses.append(f"{suite}/{c['case_id']}: split {r:.2f}x best vLLM")
                else:
                    unscored.append(f"{suite}/{c['case_id']}")
                auto = _by_prefix(c, "vllm-auto")
                decode_rows.append("| " + " | ".join([
                    c["case_id"], _us(split), _us(nat), _us(_by_prefix(c, "deepselect")),
                    *(_us(_by_prefix(c, n), why) for n in VLLM_DECODE), f"{_us(auto, why)} ({_chose(auto)})",
                    f"{cp:.1f}" if cp is not None else "-", f"{best:.1f}" if best else "-", ratio,
                    f"{_t(nat) / best:.2f}" if best and _t(nat) else "-"]) + " |")
                continue
            ratio = "-"
            if _t(nat) is not None and _t(up) is not None and cp is not None:
                r = _t(nat) / (_t(up) - cp)  # type: ignore[operator]
                native_ratios.append(r)
                ratio = f"{r:.3f}" + ("" if abs(r - 1) <= TOLERANCE else " **miss**")
                if abs(r - 1) > TOLERANCE:
                    misses.append(f"{suite}/{c['case_id']}: {r:.3f}")
            elif _t(up) is not None or up is None or up["status"] != "unsupported":
                unscored.append(f"{suite}/{c['case_id']}")  # not a case vLLM declines (bf16): a result missing
            row = [_us(nat), _us(up, why), f"{cp:.1f}" if cp is not None else "-", ratio,
                   _us(_by_prefix(c, "deepselect")), _us(_by_prefix(c, "vllm-deepselect"), why)]
            prefill_rows.append(f"| {suite} | {c['case_id']} | " + " | ".join(row) + " |")
    if len(prefill_rows) > 2:
        lines += [*prefill_rows, ""]
    if len(decode_rows) > 2:
        lines += [f"Decode shapes (width {DECODE_WIDTH}{''.join(', ' + x for x in lengths)}): *best vLLM* is the fastest of "
                  "vLLM's three decode kernels less the copy (for a bf16 case: on its float32 twin, since vLLM's "
                  f"decode kernels read float32 on this GPU); target for `split`: within {DECODE_TARGET}x.", "",
                  *decode_rows, ""]
    if why:
        lines += ["*n/a*: the selector declined the case (unsupported, nothing timed): " + "; ".join(
            f"{name}: {', '.join(sorted(reasons))}" for name, reasons in sorted(why.items())) + ".", ""]
    if native_ratios:
        lines += [f"native / (vLLM - copy) over {len(native_ratios)} prefill cases: {min(native_ratios):.3f}-"
                  f"{max(native_ratios):.3f}, {sum(abs(r - 1) <= TOLERANCE for r in native_ratios)} within "
                  f"+-{TOLERANCE:.0%}.", ""]
    if split_ratios:
        lines += [f"split / best vLLM over {len(split_ratios)} decode cases: {min(split_ratios):.2f}-"
                  f"{max(split_ratios):.2f}, {sum(r <= DECODE_TARGET for r in split_ratios)} within "
                  f"{DECODE_TARGET}x.", ""]
    if unscored:
        lines += ["Not scored (a result of ours or vLLM's missing, failed or untimed): " + "; ".join(unscored) + ".", ""]
    lines += ["Misses (prefill: native outside +-5% of vLLM's prefill kernel; decode: split above "
              f"{DECODE_TARGET}x the best vLLM decode kernel): " + ("; ".join(misses) if misses else "none.")]
    return lines, env


def report(out: Path, md: Path) -> None:
    commands = json.loads((out / "commands.json").read_text())
    body, env = tables(out)
    gpu = env.get("gpu") or env.get("device_name") or env.get("device") or "?"
    lines = ["# Fidelity of the bundled kernels to vLLM 0.33's own", "",
              f"Measured {datetime.date.today().isoformat()} on {gpu} "
              f"({', '.join(f'{k} {v}' for k, v in env.items() if k in ('torch', 'cuda', 'driver', 'sm_clock_mhz'))}),"
              " one run per suite, default protocol (CUDA graph per case and selector, cold L2, medians in "
              "microseconds). vLLM's kernels are the released 0.33.0 wheel's, loaded with "
              "`torch.ops.load_library`; they write a contiguous (rows, top_k) block, so their adapters copy "
              "into the strided view inside the timed launch: *copy* is that copy timed alone, less the time of "
              "a one-element kernel timed the same way (the fixed cost of a timed replay), and the "
              f"ratio compares native with vLLM's time less it (target: within +-{TOLERANCE:.0%}).", "",
              "Commands:", "", *[f"    {c}" for c in commands.values()], "", *body, ""]
    md.write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lib", help="vLLM's _C_stable_libtorch.abi3.so")
    p.add_argument("--ds-lib", help="vLLM's _deepselect_C.abi3.so")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--md", type=Path, default=Path("bench/FIDELITY.md"))
    p.add_argument("--scratch", default="/tmp", help="where the archive of our own cases is written")
    p.add_argument("--suites", default="seed-controls,stress,own",
                   help=f"what to replay, of {','.join(SUITES)} (own: our own cases)")
    p.add_argument("--no-run", action="store_true", help="only write the report from --out's JSON")
    args = p.parse_args()
    if not args.no_run:
        if not (args.lib and args.ds_lib):
            p.error("--lib and --ds-lib are needed to run")
        run(args)
    report(args.out, args.md)


if __name__ == "__main__":
    main()
