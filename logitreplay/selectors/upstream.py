"""One base for every adapter to an upstream kernel (vLLM's libraries, FlashInfer, SGLang, sgl-kernel,
DeepSelect, cuDNN frontend): find the kernel (installed, or from a path), refuse a GPU it has no code
for, state its limits, stage its output, and say in `note` what ran.

An adapter is stateless between `supports` and its launch: `prepare_case` gets the case itself (the
engine passes it; see `selectors.base.prepare_for`), so a kernel whose call depends on recorded facts
(vLLM's decode `next_n` and `max_seq_len`, the backend vLLM would pick) reads them there. The plain
protocol `prepare` runs the same call with the facts the tensors alone give (one request per row).

Upstream kernels write contiguous outputs, or outputs in their own index space (a page table's slots,
ragged offsets); a launch ends with the copy or the map back into our view, `rows * top_k * 4` bytes
(`staging_bytes`), part of the timed launch and reported by `note`.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable

import torch

from logitreplay.archive import Case
from logitreplay.errors import one_line
from logitreplay.selectors.base import Launch
from logitreplay.selectors.vllm_libs import Loaded, has_op, missing_arch


def library_label(path: str) -> str:
    """The column name's suffix for a kernel loaded from `path`: the name of the folder given, or of the
    folder holding the library file given (builds A and B)."""
    path = os.path.abspath(path)
    return os.path.basename(path if os.path.isdir(path) else os.path.dirname(path)) or os.path.basename(path)


class Upstream:
    """An upstream kernel: subclasses give `find` (where it comes from), `limits` and `prepare_case`."""

    name: str
    label: str = ""  # what the architecture probe names (a library or module)

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        if path is not None:
            self.name = f"{type(self).name}@{library_label(path)}"

    def find(self) -> Loaded | str:
        """Where the kernel was loaded from, or why it cannot be."""
        raise NotImplementedError

    def supports(self, case: Case, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "an upstream CUDA kernel: needs a CUDA device"
        found = self.find()
        if isinstance(found, str):
            return found
        return missing_arch(found, self.label or found.source, torch.cuda.get_device_capability(device)) or \
            self.limits(case, device)

    def limits(self, case: Case, device: torch.device) -> str | None:
        return None

    def staging_bytes(self, case: Case) -> int:
        """Bytes of the output the upstream call writes before the copy (or map back) into the view."""
        return case.rows * case.top_k * 4

    def kernel_name(self, case: Case) -> str:
        return type(self).name

    def note(self, case: Case) -> str:
        found = self.find()
        source = found.source if isinstance(found, Loaded) else "?"
        return f"{self.kernel_name(case)} from {source}; staging copy {self.staging_bytes(case)} B"

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        return self.prepare_case(None, logits, row_starts, row_ends, top_k, out)

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        raise NotImplementedError


# ------------------------------------------------------------------------------------ common limits

def starts_at_zero(case: Case, who: str = "takes row lengths only") -> str | None:
    """The one check of "every row starts at column 0" (decode kernels, per-row `end` only)."""
    if case.rows and bool((case.row_starts != 0).any()):
        return f"{who}: rows starting past column 0 (multi-request chunks) are not supported"
    return None


def fp32_only(case: Case) -> str | None:
    return None if case.dtype == "float32" else f"reads float32 logits only, not {case.dtype}"


def staged(kernel: Callable[[torch.Tensor], None], out: torch.Tensor) -> Launch:
    """A launch that runs `kernel` into a contiguous block shaped like `out`, then copies it into `out`."""
    scratch = torch.empty(out.shape, dtype=torch.int32, device=out.device)

    def launch() -> None:
        kernel(scratch)
        out.copy_(scratch)

    return launch


# ------------------------------------------------------------------------------ finding a package

@functools.cache
def import_package(module: str, package: str, path: str | None = None) -> Loaded | str:
    """Import `module` as installed, or from the folder `path` (put first on sys.path); a second folder
    for a module already imported from elsewhere is refused (one copy per process)."""
    top = module.split(".")[0]
    if path is not None:
        path = os.path.abspath(path)
        if not os.path.isdir(path):
            return f"no folder {path} to import {module} from"
        held = sys.modules.get(top)
        if held is not None and not str(getattr(held, "__file__", "") or "").startswith(path):
            return (f"this process already imported {top} from {getattr(held, '__file__', '?')}; another copy "
                    "cannot be loaded beside it (run it in a process of its own: --isolate)")
        if path not in sys.path:
            sys.path.insert(0, path)
    if importlib.util.find_spec(top) is None:
        return f"not installed (pip install {package})"
    try:
        mod = importlib.import_module(module)
    except Exception as e:  # a broken install or an ABI mismatch with this torch
        return f"{module} does not import ({type(e).__name__}: {one_line(e, 160)})"
    return Loaded(path or module, getattr(mod, "__file__", None))


@functools.cache
def load_library(path: str, namespace: str, probe_op: str) -> Loaded | str:
    """A torch extension library given as a file: loaded once, and it must register `probe_op`."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        return f"no kernel library at {path}"
    if has_op(namespace, probe_op):
        return (f"torch.ops.{namespace}.{probe_op} is already registered in this process, so {path} cannot "
                "be loaded beside it (run it in a process of its own: --isolate)")
    try:
        torch.ops.load_library(path)
    except Exception as e:
        return f"{path} does not load ({type(e).__name__}: {one_line(e, 160)})"
    if not has_op(namespace, probe_op):
        return f"{path} registers no torch.ops.{namespace}.{probe_op}"
    return Loaded(path, path)


__all__ = ["Upstream", "fp32_only", "import_package", "library_label", "load_library", "staged",
           "starts_at_zero"]
