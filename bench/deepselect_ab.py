"""deepselect built from other revisions of its source, side by side in one replay (before/after a change).

A kernel change is judged against the code it replaces on the same GPU, cases and protocol, in one run:
each variant is `deepselect.cu` (and the headers of its folder) taken from a git revision or a file,
built with the bundled kernels' own flags, and replayed as a selector column `deepselect@NAME` beside
the others (upstream DeepSelect included) by `logitreplay replay`, which verifies every column.

    python bench/deepselect_ab.py prepare pre-rebet=08912d3^ head=HEAD tree=.   # on a checkout
    python bench/deepselect_ab.py build                                         # on the GPU host
    logitreplay replay --suite seed-controls \
        --selectors 'bench.deepselect_ab:pre-rebet,bench.deepselect_ab:tree'
    python bench/deepselect_ab.py table seed-controls.json indexer.json         # medians and ratios

`prepare` writes `.ds-variants/NAME/` (the sources, the config `deepselect.cu` includes where the
revision has one, and `source.json`: the revision and the sha256 of each file); `build` compiles every
prepared folder for the current device; the factories
(`bench.deepselect_ab:NAME`, resolved by the module's `__getattr__`) load `NAME/deepselect.so`.
`LR_DS_VARIANTS` names another folder than `.ds-variants`.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KERNEL_DIR = "logitreplay/selectors/cuda"
FILES = ("deepselect.cu", "common.cuh", "topk_api.h", "deepselect_config.h")
# What a revision may lack: the config, whose constants revisions before it kept in deepselect.cu.
OPTIONAL = ("deepselect_config.h",)


def variants_dir() -> Path:
    return Path(os.environ.get("LR_DS_VARIANTS", ".ds-variants"))


def source_bytes(rev: str, name: str) -> bytes | None:
    """`name` of the kernel folder at git revision `rev`, or in the working tree when `rev` is '.'; a
    `rev` ending in .cu is a file that stands for deepselect.cu (the headers are the tree's). None for an
    OPTIONAL file the revision does not have."""
    if rev.endswith(".cu") and name == "deepselect.cu":
        return Path(rev).read_bytes()
    if rev == "." or rev.endswith(".cu"):
        path = Path(KERNEL_DIR) / name
        return path.read_bytes() if path.is_file() or name not in OPTIONAL else None
    show = subprocess.run(["git", "show", f"{rev}:{KERNEL_DIR}/{name}"], capture_output=True)
    if show.returncode != 0 and name in OPTIONAL:
        return None
    show.check_returncode()
    return show.stdout


def prepare(specs: list[str], root: Path) -> None:
    for spec in specs:
        name, _, rev = spec.partition("=")
        if not name or not rev:
            sys.exit(f"variant {spec!r}: expected NAME=REVISION (or NAME=. for the working tree)")
        if name in globals():
            sys.exit(f"variant {name!r}: a name of this module's own (`bench.deepselect_ab:{name}` would load "
                     "that, not the variant); choose another")
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        digests = {}
        for f in FILES:
            data = source_bytes(rev, f)
            if data is None:
                (folder / f).unlink(missing_ok=True)  # a folder prepared before from another revision
                continue
            (folder / f).write_bytes(data)
            digests[f] = hashlib.sha256(data).hexdigest()
        commit = "working tree" if rev == "." or rev.endswith(".cu") else subprocess.run(
            ["git", "rev-parse", "--short", rev], capture_output=True, text=True, check=True).stdout.strip()
        (folder / "source.json").write_text(json.dumps({"revision": rev, "commit": commit, "sha256": digests},
                                                       indent=1) + "\n")
        print(f"{name}: {rev} ({commit}) deepselect.cu {digests['deepselect.cu'][:12]}")


def build_all(root: Path) -> dict[str, Path]:
    """Every prepared variant compiled for the current device, in parallel (as build.py compiles)."""
    from logitreplay.selectors.cuda import build

    tc, arch = build.toolchain(), build.device_arch()
    folders = sorted(p for p in root.iterdir() if (p / "deepselect.cu").is_file())

    def one(folder: Path) -> Path:
        lib = folder / "deepselect.so"
        cmd = [str(tc.nvcc), *build.FLAGS, build.gencode(arch), "-o", str(lib), str(folder / "deepselect.cu")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{folder.name}: nvcc failed:\n{proc.stderr[-2000:]}")
        return lib

    with ThreadPoolExecutor() as pool:
        return dict(zip((f.name for f in folders), pool.map(one, folders), strict=True))


# ptxas's report of one function (nvcc --resource-usage): its properties line, then its registers line.
_FUNCTION = re.compile(r"Function properties for (\S+)")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_REGISTERS = re.compile(r"Used (\d+) registers")
_KERNEL = re.compile(r"deepselect_kernelI(f|13__nv_bfloat16)Li(\d+)ELb([01])E")


def resource_usage(ptxas_report: str) -> dict[str, dict[str, int]]:
    """Per instantiation of deepselect_kernel ("fp32 k512 wide"): registers, stack frame, spill stores
    and spill loads in bytes, as ptxas reports them (functions other than the kernels are left out)."""
    out: dict[str, dict[str, int]] = {}
    label, spills = None, (0, 0, 0)
    for line in ptxas_report.splitlines():
        if m := _FUNCTION.search(line):
            k = _KERNEL.search(m.group(1))
            label = None if k is None else (f"{'fp32' if k.group(1) == 'f' else 'bf16'} k{k.group(2)}"
                                            f"{' wide' if k.group(3) == '1' else ''}")
        elif (m := _SPILLS.search(line)) and label:
            spills = tuple(int(x) for x in m.groups())
        elif (m := _REGISTERS.search(line)) and label:
            out[label] = {"registers": int(m.group(1)), "stack": spills[0], "spill_stores": spills[1],
                          "spill_loads": spills[2]}
            label = None
    return dict(sorted(out.items()))


def resources(root: Path, arch: str, names: list[str]) -> dict[str, dict]:
    """The prepared variants `names` (default: all, by name) compiled as the bundled build compiles them
    (no GPU needed): each one's source and ptxas's resource usage per kernel instantiation."""
    from logitreplay.selectors.cuda import build

    tc = build.toolchain()
    prepared = sorted(p for p in root.iterdir() if (p / "deepselect.cu").is_file())
    folders = [root / n for n in names] or prepared

    def one(folder: Path) -> dict:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [str(tc.nvcc), *build.FLAGS, "--resource-usage", build.gencode(arch), "-o",
                   str(Path(tmp) / "deepselect.so"), str(folder / "deepselect.cu")]
            proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{folder.name}: nvcc failed:\n{proc.stderr[-2000:]}")
        return {"source": json.loads((folder / "source.json").read_text()),
                "kernels": resource_usage(proc.stdout + proc.stderr)}

    with ThreadPoolExecutor() as pool:
        found = dict(zip((f.name for f in folders), pool.map(one, folders), strict=True))
    return {"arch": arch, "nvcc": tc.version, "flags": list(build.FLAGS), "variants": found}


def print_resources(report: dict) -> None:
    names = list(report["variants"])
    print(f"registers / stack / spill stores / spill loads (bytes), nvcc {report['nvcc']}, {report['arch']}")
    print(f"{'kernel':>14} " + " ".join(f"{n[:20]:>20}" for n in names))
    for label in report["variants"][names[0]]["kernels"]:
        cells = []
        for n in names:
            k = report["variants"][n]["kernels"].get(label)
            cells.append("-" if k is None else
                         f"{k['registers']}/{k['stack']}/{k['spill_stores']}/{k['spill_loads']}")
        print(f"{label:>14} " + " ".join(f"{c:>20}" for c in cells))


def variant(name: str) -> Callable[[], object]:
    """The factory of the selector `deepselect@NAME`: the bundled deepselect selector on NAME's library."""

    def factory() -> object:
        from logitreplay.selectors.cuda import abi
        from logitreplay.selectors.cuda.kernels import DeepSelectCuda

        folder = variants_dir().resolve() / name
        record = json.loads((folder / "source.json").read_text())
        made_of = (f"deepselect.cu of {record['revision']} ({record['commit']}), "
                   f"sha256 {record['sha256']['deepselect.cu'][:12]}")

        class Variant(DeepSelectCuda):
            def _entry_points(self) -> dict[str, Callable[..., int]]:
                return abi.bind(ctypes.CDLL(str(folder / "deepselect.so")), "deepselect")

            def note(self, case: object) -> str:
                """The report's line for each result of this column: the source it was built from."""
                return made_of

        sel = Variant()
        sel.name = f"deepselect@{name}"
        return sel

    return factory


def __getattr__(name: str) -> Callable[[], object]:
    """`bench.deepselect_ab:NAME` for every prepared variant NAME (a module attribute by PEP 562)."""
    if name.startswith("__") or not (variants_dir() / name / "source.json").is_file():
        raise AttributeError(name)
    return variant(name)


def medians(path: Path) -> dict[str, dict[str, float]]:
    """Per case id of a replay report: column -> median us (verified results only)."""
    out: dict[str, dict[str, float]] = {}
    for case in json.loads(path.read_text())["cases"]:
        cid = case["case_id"] + ("" if case["dtype"] == "float32" else f" {case['dtype']}")
        out[cid] = {r["selector"]: r["timing"]["median_us"] for r in case["results"]
                    if r["status"] == "ok" and not r["failures"] and r.get("timing")}
    return out


def ratios(path: Path, base: str, pairs: list[tuple[str, str]] | None = None) -> tuple[list[str], list[list[str]]]:
    """One replay report as a table: the header (case, each column, each pair `a / b`) and per case each
    column's median us with its ratio to `base` ("65.9 x0.41"), then each pair's ratio of medians. A column
    with no verified time on a case is "-"; a column with none on any case is left out."""
    rows = medians(path)
    cols = list(dict.fromkeys(c for r in rows.values() for c in r))
    pairs = pairs or []
    out = []
    for cid, r in rows.items():
        cells = [cid]
        for c in cols:
            t = r.get(c)
            ratio = f" x{t / r[base]:.2f}" if t is not None and base in r and c != base else ""
            cells.append("-" if t is None else f"{t:.1f}{ratio}")
        cells += [f"{r[a] / r[b]:.2f}" if a in r and b in r else "-" for a, b in pairs]
        out.append(cells)
    return ["case", *cols, *(f"{a} / {b}" for a, b in pairs)], out


def table(paths: list[Path], base: str, pairs: list[tuple[str, str]] | None = None) -> None:
    """Print `ratios` of each report at fixed widths, the columns' names shortened (deepselect -> ds)."""
    for path in paths:
        head, rows = ratios(path, base, pairs)
        print(f"\n{path.name}: median us; x = / {base}")
        for cells in [head, *rows]:
            print(f"{cells[0][-44:]:>44} " + " ".join(f"{x.replace('deepselect', 'ds')[:16]:>16}" for x in cells[1:]))


def pair(spec: str) -> tuple[str, str]:
    """`A/B` of --pair: two column names."""
    a, sep, b = spec.partition("/")
    if not sep or not a or not b:
        raise argparse.ArgumentTypeError(f"{spec!r}: expected COLUMN/COLUMN")
    return a, b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write the variants' sources (NAME=REVISION, NAME=. for the tree)")
    p.add_argument("specs", nargs="+")
    sub.add_parser("build", help="compile every prepared variant for the current device")
    r = sub.add_parser("resources", help="registers and spills of every prepared variant (no GPU needed)")
    r.add_argument("names", nargs="*", help="the variants, in the report's order (default: all)")
    r.add_argument("--arch", default="sm_90a", help="the target architecture")
    r.add_argument("--json", type=Path, help="write the report here")
    t = sub.add_parser("table", help="medians and ratios of replay reports")
    t.add_argument("reports", nargs="+", type=Path)
    t.add_argument("--base", default="deepselect@pre-rebet", help="the column ratios divide by")
    t.add_argument("--pair", type=pair, action="append", metavar="A/B",
                   help="add the ratio of two columns (repeatable), e.g. deepselect@tree/deepselect-upstream")
    args = ap.parse_args()
    if args.cmd == "prepare":
        prepare(args.specs, variants_dir())
    elif args.cmd == "build":
        for name, lib in build_all(variants_dir()).items():
            print(f"built {name}: {lib}")
    elif args.cmd == "resources":
        report = resources(variants_dir(), args.arch, args.names)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")
        print_resources(report)
    else:
        table(args.reports, args.base, args.pair)
    return 0


if __name__ == "__main__":
    sys.exit(main())
