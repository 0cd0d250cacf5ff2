"""The reliability table: what inputs and faults the adversarial suite throws at the toolkit, and what
came out, counted from pytest's JUnit XML so the table can never drift from the tests.

    python bench/reliability.py     # run the CPU suite, keep its XML in bench/results/cpu-DATE/cpu-junit.xml
    python -m pytest -m gpu tests/ --junitxml=bench/results/h200-DATE/gpu-junit.xml   # on the GPU machine

docs/reliability.md is rendered from those committed records by `make claims` (bench/claims.py, whose
RELIABILITY names the records used). A category's "completed cases lost" is 0 when every one of its tests
passed: each test that injects a fault asserts that every case completed before it still reads and verifies
(checksums of every array).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_TESTS = ["tests/adversarial", "tests/test_capture_writer.py", "tests/test_capture_hf.py",
             "tests/test_capture_vllm_serving.py", "tests/test_capture_sync.py", "tests/test_hub.py", "tests/test_export.py", "tests/test_verify.py",
             "tests/test_replay.py", "tests/test_archive.py"]

# Test module -> (area, what is thrown at it).
CATEGORIES: dict[str, tuple[str, str]] = {
    "test_archive_faults": ("archives", "flipped, truncated and missing chunks; cases without `complete`; "
     "unknown schema; wrong dtypes and sizes; bad bounds, k, strides; non-object attributes; unparsable "
     "metadata; escaping zip entries; damaged zips; symlinked chunks"),
    "test_archive": ("archives", "property round trips of any valid case; flipped bytes; missing chunks"),
    "test_logits_faults": ("logits", "ties, zeros of both signs, denormals, +-inf, float32 extremes, sorted "
     "rows, rows of length 0/1/k-1/k/k+1, k above every row, k = 4096, 2^23 columns, NaN anywhere"),
    "test_selector_faults": ("selectors", "plugins that hang (per-case timeout), SIGSEGV, return a "
     "non-launch, write the wrong shape or dtype; damaged cases among good ones"),
    "test_cuda_faults": ("selectors (CUDA)", "an illegal memory access that kills the CUDA context, "
     "under --isolate"),
    "test_verify": ("selectors", "out-of-range, duplicate, absolute indices; missing -1 tails; wrong "
     "values; writes past the output view"),
    "test_replay": ("selectors", "broken, raising and unbuildable plugins through the CLI"),
    "test_capture_faults": ("capture", "SIGKILL at random moments; a write refused by the OS"),
    "test_capture_writer": ("capture", "queue overflow and byte budgets (drops counted, never blocking); "
     "write errors; SIGKILL mid-capture; writers and ranks sharing one archive"),
    "test_capture_hf": ("capture", "errors inside capture, a raising forward, a full disk during a model "
     "run, bad CLI input"),
    "test_capture_sync": ("capture", "the capture path on the model's thread under a no-host-sync guard "
     "(CUDA sync debug mode on a GPU)"),
    "test_gpu_kernels": ("kernels (CUDA)", "every stress and control shape in both dtypes, NaN poison outside "
     "the bounds, strided outputs, graph replay after a bounds change, NaN reporting"),
    "test_deepselect": ("kernels (CUDA)", "each top_k class and its edges, unaligned starts, adversarial "
     "orders, ties and infinities, rows of 300000 columns"),
    "test_capture_vllm": ("capture", "garbage outside [ks, ke), multi-request chunks, bad bounds, graph "
     "capture in progress, other ranks"),
    "test_capture_vllm_serving": ("capture", "inside the released vLLM: bad layouts, graph capture in progress, "
     "other ranks, forked and SIGKILLed workers, bounded close"),
    "test_hub": ("sharing", "offline, missing repo, missing revision, bad token (never printed), names "
     "escaping the target, unreachable Hub"),
    "test_export": ("sharing", "damaged and foreign safetensors files"),
    "test_hostile_archives": ("archives", "issue 17 items 1-4, 9, 10: unparsable array, case and `cases/` metadata, "
     "unknown codecs, node types that lie, deleted case metadata, killed writers (replay names them, synth "
     "and repair complete them), memory bombs in top_k/cols/row_stride/rows, 100000 one-element chunks, a "
     "FIFO chunk, an uninstalled URL scheme, one archive given twice, one id in two archives"),
    "test_escapes_and_races": ("archives", "issue 17 items 5, 8: symlinked case folders (synth, overwrite, "
     "repair), a Hub sha that is a path, Hub file names over the bookkeeping or oddly formed, two synths "
     "into one archive at once"),
    "test_hostile_imports": ("sharing", "issue 17 item 6: safetensors metadata that is not an object, "
     "non-integer or NaN top_k/cols, 2-element scalars, escaping case ids, lying rows, NaN or out-of-range "
     "reference indices"),
    "test_misbehaving_selectors": ("selectors", "issue 17 item 7: plugins writing into logits or row ends, "
     "working only on the verified call, sys.exit and KeyboardInterrupt in a launch, factories returning "
     "None, raising or exiting under --isolate, launches slower than --timeout, malformed --selector specs, "
     "a real Ctrl-C"),
    "test_streaming_and_hygiene": ("memory and code safety", "an archive 16x one case (memory must not "
     "grow); pickle anywhere in the code"),
}


@dataclass
class Tally:
    tried: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0


def run_cpu_suite(junit: Path) -> None:
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                    *CPU_TESTS], cwd=ROOT, check=False)


def tally(paths: list[Path], gpu: bool) -> dict[tuple[str, str], Tally]:
    out: dict[tuple[str, str], Tally] = defaultdict(Tally)
    for path in paths:
        for tc in ET.parse(path).iter("testcase"):
            module = (tc.get("classname") or "").rsplit(".", 1)[-1]
            if module not in CATEGORIES:
                continue
            area, what = CATEGORIES[module]
            key = (area + (" [GPU]" if gpu else ""), what)
            t = out[key]
            if tc.find("skipped") is not None:
                t.skipped += 1
                continue
            t.tried += 1
            if tc.find("failure") is not None or tc.find("error") is not None:
                t.failed += 1
            else:
                t.passed += 1
    return out


def table(rows: dict[tuple[str, str], Tally]) -> str:
    """The table and its total line (bench/claims.py renders it into docs/reliability.md from committed
    records)."""
    lines = ["| area | inputs and faults | tried | outcome as expected | failed | completed cases lost |",
             "|---|---|---|---|---|---|"]
    total = Tally()
    for (area, what), t in sorted(rows.items()):
        if t.tried == 0:
            continue
        lost = "0" if t.failed == 0 else "see failures"
        lines.append(f"| {area} | {what} | {t.tried} | {t.passed} | {t.failed} | {lost} |")
        total.tried += t.tried
        total.passed += t.passed
        total.failed += t.failed
    lines += ["", f"**Total: {total.tried} inputs tried, {total.passed} met their expected outcome, "
              f"{total.failed} failed; completed cases lost: {0 if total.failed == 0 else 'see failures'}.**"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--junit", type=Path, default=ROOT / f"bench/results/cpu-{time.strftime('%Y-%m-%d')}/cpu-junit.xml",
                    help="where the CPU run's JUnit XML is kept")
    args = ap.parse_args()
    args.junit.parent.mkdir(parents=True, exist_ok=True)
    run_cpu_suite(args.junit)
    print(table(tally([args.junit], gpu=False)))


if __name__ == "__main__":
    main()
