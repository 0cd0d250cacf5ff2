"""Sweep a bundled kernel's tunables on a GPU, verify every variant, and time them.

Each variant is the family's source (`deepselect.cu` by default, `split.cu` with --family split) built
with some of its compile-time overrides (DeepSelect: `-DLR_DS_THREADS=...`, `LR_DS_ELEMS`, `LR_DS_B2`,
`LR_DS_BLOCKS`, `LR_DS_WIDE_STRIDE`, see the Config comment in the source; split: `LR_SPLIT_THREADS`,
`LR_SPLIT_BLOCKS`, `LR_SPLIT_CACHE_KB`, `LR_SPLIT_SHARE_DIV`, `LR_SPLIT_UNROLL`, `LR_SPLIT_MIN_CHUNK`, see
the tunables at its top). For every variant:
1. correctness: every case of the stress suite (small scale) through the replay checks 1-4, a graph
   replayed after its row ends changed in place (check 5), and the NaN status flag;
2. timing: the seed-controls shapes at full scale (fp32 and bf16, values drawn on the GPU with the
   recipe's bounds and distribution), CUDA graph, cold L2, alternating rounds, together with the bundled
   native kernel and the upstream DeepSelect times measured the same way (the targets of the issue);
   with --decode also the decode shapes (1 to --decode-rows rows of up to 163840 columns, mixed
   lengths, top_k 512 and 2048), beside the bundled split kernel (the decode path). The split family
   times the decode shapes only; --against REPORT.json (a replay report of the decode suite) adds the
   best vLLM decode kernel's time there as the reference column.
The last thing printed is one table: median microseconds per case and variant, and ratios.

    python bench/deepselect_tune.py                     # default variant set
    python bench/deepselect_tune.py --variants default,b2_2048 --decode --json results.json
    python bench/deepselect_tune.py --prebuilt DIR      # reuse libraries built by --build-only DIR
    python bench/deepselect_tune.py --family split --decode-rows 512 --against decode.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import torch
from fidelity import best_decode_us  # bench/, beside this script: the split family's reference

from logitreplay.archive import Case
from logitreplay.datasets import synth
from logitreplay.replay import (
    OutputBuffer,
    TimingProtocol,
    check_output,
    environment,
    expected_values,
    measure_read_bandwidth,
    sm_clock_mhz,
    time_launches,
)
from logitreplay.selectors.cuda import build

FAMILIES: dict[str, dict[str, dict[str, int]]] = {
    "deepselect": {
        "default": {},
        "w16k": {"LR_DS_WIDE_STRIDE": 16384},
        "e32_b2": {"LR_DS_ELEMS": 32, "LR_DS_BLOCKS": 2},
        "e16_b4": {"LR_DS_ELEMS": 16, "LR_DS_BLOCKS": 4},
        "b4": {"LR_DS_BLOCKS": 4},
        "e16": {"LR_DS_ELEMS": 16},
        "b2_512": {"LR_DS_B2": 512},
        "b2_2048": {"LR_DS_B2": 2048},
        "t128": {"LR_DS_THREADS": 128, "LR_DS_BLOCKS": 8},
    },
    "split": {
        "default": {},
        "k64": {"LR_SPLIT_CACHE_KB": 64},
        "s1": {"LR_SPLIT_SHARE_DIV": 1},
        "u8": {"LR_SPLIT_UNROLL": 8},
        "t256": {"LR_SPLIT_THREADS": 256, "LR_SPLIT_BLOCKS": 4, "LR_SPLIT_CACHE_KB": 32},
        "t1024": {"LR_SPLIT_THREADS": 1024, "LR_SPLIT_BLOCKS": 1, "LR_SPLIT_CACHE_KB": 192},
        "m4k": {"LR_SPLIT_MIN_CHUNK": 4096},
        "m8k": {"LR_SPLIT_MIN_CHUNK": 8192},
    },
}

# Upstream DeepSelect on an H200 (cold L2, CUDA graph), microseconds: (fp32, bf16), keyed by
# (distribution, cols, rows, top_k).
UPSTREAM = {
    ("normal", 4096, 8192, 512): (213.2, 100.2),
    ("normal", 8192, 8192, 512): (261.4, 123.4),
    ("normal", 25600, 2048, 512): (167.0, 87.5),
    ("normal", 51200, 2048, 512): (243.1, 121.6),
    ("normal", 102400, 1310, 512): (208.6, 117.2),
    ("normal+100", 8192, 8192, 512): (283.2, 122.1),
    ("normal*1e-8", 8192, 8192, 512): (260.3, 122.9),
    ("normal", 65536, 4096, 2048): (1057.2, 505.6),
}

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong


def build_variant(family: str, name: str, defines: dict[str, int], arch: str, out_dir: Path) -> Path:
    tc = build.toolchain()
    lib = out_dir / f"{family}-{name}-{arch}.so"
    cmd = [str(tc.nvcc), *build.FLAGS, build.gencode(arch), *(f"-D{k}={v}" for k, v in defines.items()),
           "-o", str(lib), str(build.SOURCE_DIR / f"{family}.cu")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"variant {name}: nvcc failed:\n{proc.stderr[-2000:]}")
    return lib


def build_all(family: str, names: list[str], arch: str, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor() as pool:
        futures = {n: pool.submit(build_variant, family, n, FAMILIES[family][n], arch, out_dir) for n in names}
        return {n: f.result() for n, f in futures.items()}


class Kernel:
    """One built library of the C ABI of common.cuh, callable on torch tensors."""

    def __init__(self, path: Path, name: str) -> None:
        self.lib = ctypes.CDLL(str(path))
        self.topk = getattr(self.lib, f"lr_{name}_topk")
        self.topk.argtypes = [_P, _I, _LL, _P, _P, _I, _I, _P, _LL, _P, _LL, _P]
        self.topk.restype = _I
        self.workspace_bytes = getattr(self.lib, f"lr_{name}_workspace_bytes")
        self.workspace_bytes.argtypes = [_I, _I, _I, _I]
        self.workspace_bytes.restype = _LL
        self.workspace = torch.zeros(4096, dtype=torch.uint8, device="cuda")

    def launcher(self, logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, top_k: int,
                 out: torch.Tensor):
        dtype = 0 if logits.dtype == torch.float32 else 1
        need = self.workspace_bytes(logits.shape[0], logits.shape[1], top_k, dtype)
        if need > self.workspace.numel():  # zeroed once, as the C interface asks
            self.workspace = torch.zeros(need, dtype=torch.uint8, device="cuda")
        args = (logits.data_ptr(), dtype, logits.stride(0), starts.data_ptr(), ends.data_ptr(), logits.shape[0],
                top_k, out.data_ptr(), out.stride(0), self.workspace.data_ptr(), self.workspace.numel())

        def launch() -> None:
            rc = self.topk(*args, torch.cuda.current_stream().cuda_stream)
            if rc != 0:
                raise RuntimeError(f"launch returned {rc}")

        return launch

    def nan_flag(self) -> int:
        return int(self.workspace[:4].view(torch.int32).item())


def check_case(kernel: Kernel, case, failures: list[str]) -> None:
    logits = case.padded(device="cuda")
    starts = torch.from_numpy(case.row_starts).cuda()
    ends = torch.from_numpy(case.row_ends).cuda()
    out = OutputBuffer(case.rows, case.top_k, "cuda")
    kernel.launcher(logits, starts, ends, case.top_k, out.view)()
    expected = expected_values(logits, starts, ends, case.top_k)
    failures += [str(f) for f in check_output(case, logits, starts, ends, out, expected)]


def check_graph_bounds_change(kernel: Kernel, case, failures: list[str]) -> None:
    """Capture once, change the row bounds in place, replay: the replay must see the new bounds."""
    logits = case.padded(device="cuda")
    starts = torch.from_numpy(case.row_starts).cuda()
    ends = torch.from_numpy(case.row_ends).cuda()
    out = OutputBuffer(case.rows, case.top_k, "cuda")
    launch = kernel.launcher(logits, starts, ends, case.top_k, out.view)
    launch()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch()
    gen = torch.Generator(device="cuda").manual_seed(7)
    lengths = ends - starts
    ends.sub_((torch.rand(lengths.shape, device="cuda", generator=gen) * lengths).to(torch.int32))
    # The new bounds must still be valid cells of the case: poison what left the bounds as well.
    col = torch.arange(logits.shape[1], device="cuda")
    inside = (col >= starts[:, None]) & (col < ends[:, None])
    logits.masked_fill_(~inside, 1e30)
    out.reset()
    graph.replay()
    expected = expected_values(logits, starts, ends, case.top_k)
    failures += ["graph replay after a bounds change: " + str(f)
                 for f in check_output(case, logits, starts, ends, out, expected)]


def check_nan(kernel: Kernel, failures: list[str]) -> None:
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(8, 3000, device="cuda").to(dtype)
        logits[5, 2000] = float("nan")
        starts = torch.zeros(8, dtype=torch.int32, device="cuda")
        ends = torch.full((8,), 3000, dtype=torch.int32, device="cuda")
        out = torch.empty(8, 512, dtype=torch.int32, device="cuda")
        kernel.workspace.zero_()
        kernel.launcher(logits, starts, ends, 512, out)()
        torch.cuda.synchronize()
        if kernel.nan_flag() != 1:
            failures.append(f"NaN in a {dtype} row not reported (status {kernel.nan_flag()})")
        kernel.workspace.zero_()
        ends[5] = 1999  # the NaN is now outside its row
        kernel.launcher(logits, starts, ends, 512, out)()
        torch.cuda.synchronize()
        if kernel.nan_flag() != 0:
            failures.append(f"NaN outside the bounds reported for {dtype}")


def correctness(kernel: Kernel) -> list[str]:
    failures: list[str] = []
    cases = list(synth.suite("stress", "small"))
    for case in cases:
        check_case(kernel, case, failures)
    # Few long rows, misaligned starts, a row of exactly top_k + 1 and one shorter than top_k.
    gen = torch.Generator().manual_seed(11)
    for dtype in (torch.float32, torch.bfloat16):
        ends = torch.tensor([300_000, 299_990, 3000, 513, 140_001, 511], dtype=torch.int32)
        starts = torch.tensor([0, 7, 1000, 0, 5, 0], dtype=torch.int32)
        values = torch.randn(int((ends - starts).sum()), generator=gen).to(dtype)
        cases.append(Case.from_rows(f"long-{dtype}", values, starts, ends, top_k=512, cols=300_000,
                                    row_stride=300_013))
    for case in cases[-2:]:
        check_case(kernel, case, failures)
    check_graph_bounds_change(kernel, next(c for c in cases if "chunk" in c.case_id), failures)
    check_graph_bounds_change(kernel, cases[-1], failures)
    check_nan(kernel, failures)
    return failures


def control_matrix(recipe: synth.Recipe, dtype: torch.dtype):
    """The recipe's bounds with values drawn on the GPU (same distribution family as the suite)."""
    starts, ends = synth.bounds(recipe)
    gen = torch.Generator(device="cuda").manual_seed(recipe.seed)
    x = torch.randn(recipe.rows, recipe.cols, device="cuda", generator=gen)
    if recipe.distribution == "normal+100":
        x += 100
    elif recipe.distribution == "normal*1e-8":
        x *= 1e-8
    s = torch.from_numpy(starts).cuda()
    e = torch.from_numpy(ends).cuda()
    col = torch.arange(recipe.cols, device="cuda")
    x.masked_fill_((col < s[:, None]) | (col >= e[:, None]), 1e30)
    return x.to(dtype), s, e


def decode_recipes(max_rows: int) -> list[synth.Recipe]:
    """The decode suite's batch shapes of at most `max_rows` rows (mixed lengths up to 163840)."""
    return [r for r in synth.recipes("decode", "full")
            if isinstance(r, synth.DecodeRecipe) and r.group == "batch" and r.rows <= max_rows]


def best_vllm(report: Path) -> dict[str, float]:
    """Per case id of a replay report: the best median of vLLM's decode kernels there."""
    cases = json.loads(report.read_text())["cases"]
    return {c["case_id"]: t for c in cases if (t := best_decode_us(c)) is not None}


def timings(kernels: dict[str, Kernel], others: dict[str, Kernel], recipes: list[synth.Recipe],
            protocol: TimingProtocol, failures: list[str], against: dict[str, float],
            saved: Callable[[list[dict]], None]) -> list[dict]:
    """Every case timed and verified; `saved` gets the rows so far after each (a sweep cut short keeps them)."""
    bandwidth = measure_read_bandwidth(torch.device("cuda"))
    rows = []
    for recipe in recipes:
        for dtype in (torch.float32, torch.bfloat16):
            logits, s, e = control_matrix(recipe, dtype)
            outs = {}
            launches = {}
            # split (the decode path) only on decode shapes.
            beside = {n: k for n, k in others.items() if n != "split" or isinstance(recipe, synth.DecodeRecipe)}
            for name, k in [*kernels.items(), *beside.items()]:
                outs[name] = OutputBuffer(recipe.rows, recipe.top_k, "cuda")
                launches[name] = k.launcher(logits, s, e, recipe.top_k, outs[name].view)
            t = time_launches(launches, torch.device("cuda"), protocol)
            # Verify the deepselect variants on this full-scale case too (checks 1-4).
            expected = expected_values(logits, s, e, recipe.top_k)
            # check_output reads only the case id from its case (the values were drawn here, not stored).
            suffix = "bf16" if dtype == torch.bfloat16 else "fp32"
            label = cast(Case, SimpleNamespace(case_id=f"{recipe.case_id}-{suffix}"))
            for name in kernels:
                failures += [f"{name}: {f}" for f in check_output(label, logits, s, e, outs[name], expected)]
            key = (recipe.distribution, recipe.cols, recipe.rows, recipe.top_k)
            up = UPSTREAM.get(key)
            if against:  # a bf16 decode case against vLLM on its fp32 twin (vLLM's kernels read fp32 only)
                ref = against.get(recipe.case_id)
            else:
                ref = None if up is None else up[dtype == torch.bfloat16]
            rows.append({"case": recipe.case_id,
                         "label": (f"decode b{recipe.batch} n{recipe.next_n} k{recipe.top_k}"
                                   if isinstance(recipe, synth.DecodeRecipe)
                                   else f"{recipe.distribution} {recipe.cols}x{recipe.rows} k{recipe.top_k}"),
                         "others": list(beside),
                         "dtype": "bf16" if dtype == torch.bfloat16 else "fp32",
                         "upstream": ref,
                         "floor": int((e - s).sum()) * logits.element_size() / bandwidth * 1e6,
                         **{n: t[n].median_us for n in t}})
            saved(rows)
            del logits
            torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict], names: list[str]) -> None:
    others = list(dict.fromkeys(o for r in rows for o in r["others"]))
    head = ["dtype", "floor", "upstream", *others, *names]
    print("\nmedian us (cold L2, CUDA graph); last column: best variant / reference (upstream or vLLM)")
    print(f"{'case (cols x rows)':>28} " + " ".join(f"{h[:10]:>10}" for h in head) + "  best/up")
    for r in rows:
        best = min(r[n] for n in names)
        ratio = f"{best / r['upstream']:.2f}" if r["upstream"] else "-"
        cells = [r["dtype"]] + ["-" if r.get(h) is None else f"{r[h]:.1f}" for h in head[1:]]
        print(f"{r['label']:>28} " + " ".join(f"{c:>10}" for c in cells) + f"  {ratio}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="deepselect", help="the kernel swept")
    ap.add_argument("--variants", default=None, help="names of the family's variants (default: all)")
    ap.add_argument("--prebuilt", type=Path, help="folder of libraries from --build-only")
    ap.add_argument("--build-only", type=Path, help="build the variants into this folder and exit")
    ap.add_argument("--arch", default=None, help="target architecture (default: the current device's)")
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--skip-controls", action="store_true", help="time no seed-controls shapes")
    ap.add_argument("--decode", action="store_true", help="also time the decode shapes (beside split)")
    ap.add_argument("--decode-rows", type=int, default=64, help="the largest decode shape timed, in rows")
    ap.add_argument("--against", type=Path, help="a replay report of the decode suite: the reference times")
    ap.add_argument("--full-protocol", action="store_true",
                    help="the replay protocol (25 warmups, 4 alternating rounds of 10) instead of a quick sweep")
    args = ap.parse_args()
    family = args.family
    names = args.variants.split(",") if args.variants else list(FAMILIES[family])
    arch = args.arch or build.device_arch()
    t0 = time.time()
    if args.build_only:
        build_all(family, names, arch, args.build_only)
        print(f"built {len(names)} variants for {arch} in {time.time() - t0:.0f} s")
        return 0
    libs = {}
    if args.prebuilt:
        try:
            libs = {n: args.prebuilt / f"{family}-{n}-{arch}.so" for n in names}
            for p in libs.values():
                ctypes.CDLL(str(p))
        except OSError as e:
            print(f"prebuilt libraries unusable here ({e}); building")
            libs = {}
    if not libs:
        libs = build_all(family, names, arch, Path(tempfile.mkdtemp(prefix=f"{family}-variants-")))
    print(f"libraries ready in {time.time() - t0:.0f} s", flush=True)
    kernels = {n: Kernel(p, family) for n, p in libs.items()}
    others = {"native": Kernel(build.build("native", arch), "native")}
    if args.decode and family != "split":
        others["split"] = Kernel(build.build("split", arch), "split")

    device = torch.device("cuda")
    report: dict = {"environment": environment(device), "sm_clock_mhz": sm_clock_mhz(device),
                    "family": family, "variants": {n: FAMILIES[family].get(n) for n in names}}
    all_failures: dict[str, list[str]] = {}
    for n, k in kernels.items():
        all_failures[n] = correctness(k)
        print(f"correctness {n}: {'ok' if not all_failures[n] else all_failures[n][:5]}", flush=True)
    report["correctness"] = all_failures
    if not args.skip_timing:
        tfail: list[str] = []
        protocol = TimingProtocol() if args.full_protocol else TimingProtocol(warmup=5, rounds=2, samples_per_round=5)
        controls = not args.skip_controls and family != "split"
        recipes = (synth.recipes("seed-controls", "full") if controls else []) + (
            decode_recipes(args.decode_rows) if args.decode or family == "split" else [])
        against = best_vllm(args.against) if args.against else {}

        def saved(rows: list[dict]) -> None:
            if args.json:
                args.json.write_text(json.dumps({**report, "timings": rows, "full_scale_failures": tfail}, indent=1))

        rows = timings(kernels, others, recipes, protocol, tfail, against, saved)
        report["timings"] = rows
        report["full_scale_failures"] = tfail
        report["sm_clock_mhz_end"] = sm_clock_mhz(device)
        if tfail:
            print("full-scale failures:", tfail[:10])
        print_table(rows, names)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if any(all_failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
