"""The kit every adapter to a production kernel builds on (vLLM's libraries, FlashInfer, SGLang,
sgl-kernel, DeepSelect, cuDNN frontend): its declaration, and the base that finds the kernel (loading.py),
refuses a version it was not read from or a GPU it has no code for, states its limits, stages its output,
and says in `note` what ran.

Each adapter class carries one `Declared`: its name, the `Release` it was read from (the package or
library, the version read and the versions accepted), the dtypes, top_k range and row layouts it takes.
Declaring it registers it (catalog.py collects the declarations of this package's modules); the
registry, the process split, the peers' list of bench/peers.py and `logitreplay selectors` are derived
from them.

An adapter is stateless between `supports` and its launch. A kernel whose call depends on what the case
records beyond its tensors (vLLM's decode `next_n` and `max_seq_len`, the backend vLLM would pick) gets the
case in `prepare_case` (the protocol's optional form, docs/selectors.md); the plain `prepare` runs the
same call with the facts the tensors alone give (one request per row).

Upstream kernels write contiguous outputs, or outputs in their own index space (a page table's slots,
ragged offsets); a launch ends with the copy or the map back into our view, `rows * top_k * 4` bytes
(`staging_bytes`), part of the timed launch and reported by `note`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from logitreplay.archive import Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.upstream.loading import Loaded, Source, find, missing_arch


def library_label(path: str) -> str:
    """The column name's suffix for a kernel loaded from `path`: the name of the folder given, or of the
    folder holding the library file given (builds A and B)."""
    path = os.path.abspath(path)
    return os.path.basename(path if os.path.isdir(path) else os.path.dirname(path)) or os.path.basename(path)


def release_numbers(version: str) -> tuple[int, ...]:
    """A version's numbers in order, for comparison: "0.7.2.post1" -> (0, 7, 2, 1); a pre-release or
    local part is dropped ("0.34.0rc1" -> (0, 34, 0), "2.11.0+cu130" -> (2, 11, 0))."""
    head = re.split(r"[+]|(?:a|b|rc|dev)\d*", version.strip().lstrip("v"), maxsplit=1)[0]
    return tuple(int(n) for n in re.findall(r"\d+", head))


@dataclass(frozen=True)
class Release:
    """The upstream release an adapter was read from: what it loads, the version read (`read_from`),
    and the versions it accepts, `accepts[0] <= version < accepts[1]`. A version outside is refused with
    one line; one that cannot be told (a bare library file) is accepted, and `note` says so."""

    source: Source
    read_from: str
    accepts: tuple[str, str]

    def refuses(self, version: str | None) -> str | None:
        if version is None:
            return None
        low, high = (release_numbers(v) for v in self.accepts)
        if low <= release_numbers(version) < high:
            return None
        return (f"{self.source.dist} {version} is not a version this adapter knows: it was read from "
                f"{self.read_from} and takes {self.accepts[0]} <= version < {self.accepts[1]}")


# Row layouts an adapter can take: rows from column 0 (decode), rows starting anywhere (a multi-request
# prefill chunk), and a row stride larger than the row (padded logits).
ROW_LAYOUTS = ("decode", "starts", "padded")


@dataclass(frozen=True)
class Declared:
    """One adapter, as `logitreplay selectors` lists it: what it is called, what it was read from, the
    dtypes, the top_k range (inclusive) and the row layouts (`ROW_LAYOUTS`) it takes. `k` and `dtypes` state
    what `limits` checks; a test holds the two together. `k` (low, None) has no upper bound; `k_only`,
    when given, is the set of top_k inside the range that the kernel is built for."""

    name: str
    release: Release
    dtypes: tuple[str, ...]
    k: tuple[int, int | None]
    layouts: tuple[str, ...]
    k_only: tuple[int, ...] = ()

    @property
    def family(self) -> str:
        """Adapters of one family share one package or library: from two sources they need two processes."""
        return self.release.source.family


class Upstream:
    """An upstream kernel: subclasses give `declared`, `limits` and `prepare_case` (and override `find`
    where the kernel needs more than `loading.find`)."""

    declared: ClassVar[Declared]
    name: str

    def __init_subclass__(cls) -> None:
        super().__init_subclass__()
        if "declared" in cls.__dict__:
            cls.name = cls.declared.name

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        if path is not None:
            self.name = f"{type(self).name}@{library_label(path)}"

    @property
    def label(self) -> str:
        """What the architecture probe names (a library or module)."""
        return self.declared.release.source.label

    def find(self) -> Loaded | str:
        """Where the kernel was loaded from, or why it cannot be."""
        return find(self.declared.release.source, self.path)

    def supports(self, case: Case, device: torch.device) -> str | None:
        if device.type != "cuda":
            return "an upstream CUDA kernel: needs a CUDA device"
        found = self.find()
        if isinstance(found, str):
            return found
        return self.declared.release.refuses(found.version) or \
            missing_arch(found, self.label or found.source, torch.cuda.get_device_capability(device)) or \
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
        version = (found.version or VERSION_UNKNOWN) if isinstance(found, Loaded) else "?"
        return f"{self.kernel_name(case)} from {source} ({version}); staging copy {self.staging_bytes(case)} B"

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        return self.prepare_case(None, logits, row_starts, row_ends, top_k, out)

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        raise NotImplementedError


VERSION_UNKNOWN = "version unknown"
_NOTE_VERSION = re.compile(r" \(([^()]*)\); staging copy")


def note_version(note: str) -> str | None:
    """The version a note of `Upstream.note` states (what a report's verified result records as its
    reason), or None: no such note, or a version that could not be told."""
    found = _NOTE_VERSION.findall(note)
    return found[-1] if found and found[-1] not in (VERSION_UNKNOWN, "?") else None


# ------------------------------------------------------------------------------------ common limits

def starts_at_zero(case: Case, who: str = "takes row lengths only") -> str | None:
    """The one check of "every row starts at column 0" (decode kernels, per-row `end` only)."""
    if case.rows and bool((case.row_starts != 0).any()):
        return f"{who}: rows starting past column 0 (multi-request chunks) are not supported"
    return None


def fp32_only(case: Case) -> str | None:
    return None if case.dtype == "float32" else f"reads float32 logits only, not {case.dtype}"


def staged(kernel: Callable[[torch.Tensor], None], out: torch.Tensor, align: int = 1) -> Launch:
    """A launch that runs `kernel` into a block shaped like `out` (its rows `align` int32s apart, as
    DeepSelect's output alignment asks), made now, then copies it into `out`."""
    rows, top_k = out.shape
    width = -(-top_k // align) * align
    scratch = torch.empty((rows, width), dtype=torch.int32, device=out.device)[:, :top_k]

    def launch() -> None:
        kernel(scratch)
        out.copy_(scratch)

    return launch


__all__ = ["ROW_LAYOUTS", "Declared", "Release", "Upstream", "fp32_only", "library_label", "note_version",
           "release_numbers", "staged", "starts_at_zero"]
