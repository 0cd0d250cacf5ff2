"""cuDNN frontend 1.32.0's DSA indexer top-k (`cudnn.deepseek_sparse_attention.IndexerTopK`), a CuTe DSL
radix kernel compiled on first use, called through its class API as its docstring says it is meant to be
used: a plan built from sample tensors, `check_support()` and `compile()` before any launch (here in
`prepare`), then `execute()` into caller-owned buffers, which upstream states is safe to capture in a
CUDA graph once compiled.

What the wheel's sources state (`cudnn/deepseek_sparse_attention/indexer_top_k/api.py` and
`indexer_top_k_decode_varlen.py`):
- `IndexerTopK(sample_input_values, sample_seq_lens, top_k, next_n=1, return_val=True, num_copy_bits=256,
  tie_break=0, deterministic=False)`; `execute(input_values, seq_lens, out_indices=, out_values=,
  workspace=)`.
- Input: float32, float16 or bfloat16 `(rows, cols)` with strides `(cols, 1)` (the class rejects a
  padded row stride; `indexer_top_k_wrapper` copies such a matrix first) and a 32-byte-aligned base;
  `seq_lens` int32 `(rows / next_n,)`. With `next_n = 1` row r selects among columns `[0, seq_lens[r])`:
  the kernel's `row_start` is 0, there is no per-row start.
- `0 < top_k <= 2048`, SM90+ (`check_support`); `compile()` builds for the current device (sm_90a on
  an H100 or H200, `utils/compiler.py`), cached per device, dtype, width rounded up to a power of two,
  k, `next_n` and whether rows > 148.
- Output: int32 `(rows, top_k)`, contiguous, column indices from 0, so ours when rows start at 0; a row
  of length <= k gets `0 .. length-1` then -1; a longer row fills all k slots, in no stated order.
- It reads each row up to its length only and writes nothing but its outputs and the caller's int32
  radix scratch (`scratch_workspace_bytes()`: rows x (2 for float32, else 1) x cols x 4 bytes).

No vLLM or SGLang call site of it was found (SGLang 0.5.23's `--dsa-topk-backend` is sgl-kernel, torch
or flashinfer; FlashInfer's experimental cuDNN top-k backend calls `cudnn.IndexerTopKVarlen`, which 1.32.0
does not have); the callers found are training code calling `indexer_top_k_wrapper(scores.contiguous(),
seq_lens, top_k, next_n=1, return_val=False)`, which builds and caches the same plan and then allocates
its outputs and workspace on every call. Here the plan, its workspace and the staging buffer are made
once in `prepare`, with `return_val=False` as those callers pass, so the timed launch is `execute` and
the copy into the view.

`deterministic=True` (`cudnn-indexer-topk-det`): the docstring of 1.32.0's class states that the cutoff
selection is then repeatable, that with `tie_break=0` the smaller source-column indices win among equal
keys, and that a row's valid indices come back in ascending order (a bitmap pass up to 262,144 columns,
a bitonic sort above it, `resolve_deterministic_ordering`); on SM120 it is refused above 16,384 float32 or
32,768 16-bit columns (shared memory), nothing is said of SM90. That is the same stated policy as the
bundled `-det` kernels, so the two are comparable as a measured cost of determinism.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.upstream.base import Declared, Release, Upstream, staged, starts_at_zero
from logitreplay.selectors.upstream.loading import Loaded, Source, find

MODULE = "cudnn.deepseek_sparse_attention.indexer_top_k"
PACKAGE = "nvidia-cudnn-frontend[cutedsl]"
# What its CuTe DSL path imports beyond the frontend, and the package each comes from.
NEEDS = (("cutlass", "nvidia-cutlass-dsl[cu13]"), ("cuda.bindings", "cuda-python"), ("tvm_ffi", "apache-tvm-ffi"))
DTYPES = ("float32", "float16", "bfloat16")
MAX_K = 2048
MIN_MAJOR = 9
INT32_MAX = (1 << 31) - 1
BUFFER_ALIGN = 32  # bytes: launch_topk_kernel's row chunks keep the scratch this aligned
# check_support's refusal of wide deterministic rows on SM120 (its 99 KiB of shared memory per block).
SM120_DETERMINISTIC_MAX_COLS = {"float32": 16384, "float16": 32768, "bfloat16": 32768}
# Compiled for the GPU it runs on (check_support: SM90+).
CUDNN_132 = Release(Source((MODULE,), PACKAGE, "nvidia-cudnn-frontend", "cudnn-frontend IndexerTopK (CuTe DSL JIT)",
                           binary=None), "1.32.0", ("1.32.0", "1.33.0"))


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing, or half imported
        return False


def cutlass_on_path(root: str | None = None) -> None:
    """Put nvidia-cutlass-dsl's `dsl_packages` folder (which holds `cutlass`) on sys.path, as the line of
    its `nvidia_cutlass_dsl_packages.pth` does: Python runs a .pth only in a site directory, so a
    `pip install --target DIR` reached through PYTHONPATH (or `NAME@DIR`) needs it done here."""
    if _importable("cutlass"):
        return
    if root is not None:
        place = os.path.join(root, "nvidia_cutlass_dsl")
    else:  # the .pth line: `nvidia_cutlass_dsl.__path__[0]`
        spec = importlib.util.find_spec("nvidia_cutlass_dsl") if _importable("nvidia_cutlass_dsl") else None
        places = list(spec.submodule_search_locations or []) if spec is not None else []
        if not places:
            return
        place = places[0]
    folder = os.path.join(place, "dsl_packages")
    if os.path.isdir(folder) and folder not in sys.path:
        sys.path.insert(0, folder)


def _scratch_words_per_row(case: Case) -> int:
    """int32 radix scratch words per row: two per float32 element (two histogram passes), one otherwise."""
    return (2 if case.dtype == "float32" else 1) * case.cols


def scratch_bytes(case: Case) -> int:
    """`IndexerTopK.scratch_workspace_bytes()` for the case: its int32 radix scratch, rounded up to 128
    bytes."""
    return -(-case.rows * _scratch_words_per_row(case) * 4 // 128) * 128


def scratch_chunk_limit(case: Case) -> str | None:
    """`launch_topk_kernel`'s refusal: the kernel indexes its scratch with int32, so a launch is split
    into row chunks that fit, and a chunk of the rows one aligned step holds must fit on its own."""
    per_row = _scratch_words_per_row(case)
    step = max(1, BUFFER_ALIGN // (4 if case.dtype == "float32" else 2))
    if case.rows * per_row > INT32_MAX and (INT32_MAX + 1) // per_row < step:
        return (f"{case.cols} columns: one aligned chunk of {step} rows overflows the kernel's int32 scratch "
                "indexing (launch_topk_kernel refuses it)")
    return None


class CudnnIndexerTopK(Upstream):
    """`IndexerTopK(logits, row_ends, top_k, next_n=1, return_val=False)`: row ends as `seq_lens`, rows
    from column 0, contiguous rows only."""

    declared = Declared("cudnn-indexer-topk", CUDNN_132, DTYPES, (1, MAX_K), ("decode",))
    deterministic = False  # the class's `deterministic=` flag

    def find(self) -> Loaded | str:
        cutlass_on_path(os.path.abspath(self.path) if self.path is not None else None)
        found = find(self.declared.release.source, self.path)
        if isinstance(found, str):
            missing = [f"{module} ({package})" for module, package in NEEDS if not _importable(module)]
            if missing and found.startswith(f"{MODULE} does not import"):  # say which package to install
                return f"{found}; its CuTe DSL path needs {', '.join(missing)}"
        return found

    def limits(self, case: Case, device: torch.device) -> str | None:
        major, minor = torch.cuda.get_device_capability(device)
        if major < MIN_MAJOR:
            return f"IndexerTopK requires SM90+ (check_support); this GPU is sm_{major}{minor}"
        if case.dtype not in DTYPES:
            return f"reads {', '.join(DTYPES)} logits, not {case.dtype}"
        if not 0 < case.top_k <= MAX_K:
            return f"top_k {case.top_k}: IndexerTopK takes 0 < k <= {MAX_K}"
        if case.rows == 0 or case.cols == 0:
            return "no rows or no columns: IndexerTopK's check_support rejects zero extents"
        if self.deterministic and (major, minor) == (12, 0) and case.cols > SM120_DETERMINISTIC_MAX_COLS[case.dtype]:
            return (f"{case.cols} columns: deterministic IndexerTopK on SM120 takes at most "
                    f"{SM120_DETERMINISTIC_MAX_COLS[case.dtype]} {case.dtype} columns (check_support)")
        if case.row_stride != case.cols:  # a single row too: the class checks the strides as given
            return (f"row stride {case.row_stride} > {case.cols} columns: IndexerTopK takes contiguous rows only "
                    "(indexer_top_k_wrapper would copy the matrix first)")
        return starts_at_zero(case, "takes row lengths only (its row_start is 0)") or scratch_chunk_limit(case)

    def kernel_name(self, case: Case) -> str:
        mode = ", deterministic=True: lowest indices at the cutoff, ascending" if self.deterministic else ""
        return (f"cudnn IndexerTopK.execute (CuTe DSL radix, next_n=1, return_val=False{mode}), "
                f"radix scratch {scratch_bytes(case)} B")

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        api = importlib.import_module(MODULE)
        plan = api.IndexerTopK(logits, row_ends, top_k, next_n=1, return_val=False, deterministic=self.deterministic)
        plan.check_support()
        plan.compile()  # the JIT build, outside the timed launch
        workspace = torch.empty(plan.scratch_workspace_bytes(), dtype=torch.uint8, device=logits.device)

        def kernel(indices: torch.Tensor) -> None:
            plan.execute(logits, row_ends, out_indices=indices, workspace=workspace)

        return staged(kernel, out)


class CudnnIndexerTopKDeterministic(CudnnIndexerTopK):
    """The same call with `deterministic=True` (tie_break 0): the stated lowest-index tie policy and
    ascending order, so what determinism costs is its time over `cudnn-indexer-topk`'s."""

    declared = Declared("cudnn-indexer-topk-det", CUDNN_132, DTYPES, (1, MAX_K), ("decode",))
    deterministic = True


__all__ = ["CUDNN_132", "CudnnIndexerTopK", "CudnnIndexerTopKDeterministic", "cutlass_on_path", "scratch_bytes", "scratch_chunk_limit"]
