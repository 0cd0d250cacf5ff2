"""vLLM's kernel libraries, found the way vLLM itself loads them, or loaded from a path.

vLLM 0.33 registers its top-k ops (`torch.ops._C.top_k_per_row_prefill`, `top_k_per_row_decode`,
`persistent_topk`, `cooperative_topk`) in `vllm._C_stable_libtorch`, which `vllm.platforms.cuda` imports;
vLLM 0.22 registered them in `vllm._C` (0.23 moved them; both modules existed until 0.24). DeepSelect
ships as `vllm._deepselect_C` (`torch.ops.deep_select.topk`), imported only by
`vllm.model_executor.layers.indexer_topk`. A kernel author's own build is loaded with
`torch.ops.load_library(path)` instead. Two builds of one op cannot be registered in one process, so a
process holds at most one source per library; the replay command runs selectors of different sources in
processes of their own (`needs_own_process`).

Whether a library has code for the GPU is read once from its fatbin table (the `.nv_fatbin` section of
the ELF file: one entry per cubin or PTX, each naming its SM architecture), so an adapter says "no sm_90
code in vllm._deepselect_C (it has sm_100)" instead of launching a kernel that cannot run.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import struct
from dataclasses import dataclass
from typing import BinaryIO

import torch

from logitreplay.errors import one_line


@dataclass(frozen=True)
class KernelLibrary:
    """One of vLLM's kernel libraries: the modules that may register it, newest layout first, the op
    namespace, and the op whose presence proves the library registered."""

    label: str
    modules: tuple[str, ...]
    namespace: str
    probe_op: str


C_OPS = KernelLibrary("vllm._C_stable_libtorch", ("vllm._C_stable_libtorch", "vllm._C"), "_C",
                      "top_k_per_row_prefill")
DEEPSELECT = KernelLibrary("vllm._deepselect_C", ("vllm._deepselect_C",), "deep_select", "topk")


@dataclass(frozen=True)
class Loaded:
    """Where a library's ops came from: the module that registered them or the path loaded, and the
    shared-library file (for the architecture probe; None when unknown)."""

    source: str
    file: str | None


def has_op(namespace: str, op: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False
    return True


# The source each library was loaded from in this process (a module name or a path).
_SOURCES: dict[str, str] = {}


def load(lib: KernelLibrary, path: str | None = None) -> Loaded | str:
    """Load `lib` from `path`, or as vLLM does; returns where it came from, or why it cannot be used."""
    return _load_path(lib, os.path.abspath(path)) if path is not None else _load_installed(lib)


@functools.cache
def _load_installed(lib: KernelLibrary) -> Loaded | str:
    if importlib.util.find_spec("vllm") is None:
        return "not installed (pip install vllm)"
    clash = _clash(lib, "installed")
    if clash:
        return clash
    problems: list[str] = []
    for module in lib.modules:
        try:
            if importlib.util.find_spec(module) is None:
                continue
            mod = importlib.import_module(module)
        except Exception as e:  # a broken install, or a build against another torch (undefined symbols)
            problems.append(f"{module} does not import ({type(e).__name__}: {one_line(e, 160)})")
            continue
        if has_op(lib.namespace, lib.probe_op):
            _SOURCES[lib.label] = "installed"
            return Loaded(module, getattr(mod, "__file__", None))
    if problems:
        return "; ".join(problems)
    return (f"the installed vllm registers no torch.ops.{lib.namespace}.{lib.probe_op} "
            f"(looked in {', '.join(lib.modules)})")


@functools.cache
def _load_path(lib: KernelLibrary, path: str) -> Loaded | str:
    if not os.path.isfile(path):
        return f"no kernel library at {path}"
    clash = _clash(lib, path)
    if clash:
        return clash
    if has_op(lib.namespace, lib.probe_op):
        return (f"torch.ops.{lib.namespace}.{lib.probe_op} is already registered in this process, so "
                f"{path} cannot be loaded beside it (run it in a process of its own: --isolate)")
    try:
        torch.ops.load_library(path)
    except Exception as e:
        return f"{path} does not load ({type(e).__name__}: {one_line(e, 160)})"
    if not has_op(lib.namespace, lib.probe_op):
        return f"{path} registers no torch.ops.{lib.namespace}.{lib.probe_op}"
    _SOURCES[lib.label] = path
    return Loaded(path, path)


def _clash(lib: KernelLibrary, source: str) -> str | None:
    held = _SOURCES.get(lib.label)
    if held is None or held == source:
        return None
    return (f"this process already holds {lib.label} from {held}; a second build of the same ops cannot "
            "be loaded beside it (run it in a process of its own: --isolate)")


def split_spec(spec: str) -> tuple[str, str | None]:
    """`name@/path/to/lib.so` -> (name, path); a spec without '@' -> (spec, None)."""
    name, sep, path = spec.partition("@")
    return (name, path) if sep and path else (spec, None)


def needs_own_process(specs: list[str], families: dict[str, str]) -> bool:
    """Whether these selector specs load one library or package from more than one source (the installed
    one and a path, or two paths): then each must run in a process of its own. `families` maps adapter
    names to the library or package they load."""
    sources: dict[str, set[str]] = {}
    for spec in specs:
        name, path = split_spec(spec)
        family = families.get(name)
        if family is not None:
            sources.setdefault(family, set()).add(os.path.abspath(path) if path else "installed")
    return any(len(s) > 1 for s in sources.values())


# ------------------------------------------------------------------------------ architecture probe

_FATBIN_MAGIC = 0xBA55ED50
_KINDS = {1: "ptx", 2: "cubin"}


@functools.cache
def fatbin_archs(file: str) -> frozenset[tuple[str, int]] | None:
    """The (kind, SM) pairs of the file's embedded GPU code ("cubin"/"ptx", e.g. 90 for sm_90); None
    when the file is not a 64-bit ELF with a `.nv_fatbin` section (then nothing is claimed)."""
    try:
        with open(file, "rb") as f:
            return _read_fatbin(f)
    except (OSError, struct.error, ValueError):
        return None


def _read_fatbin(f: BinaryIO) -> frozenset[tuple[str, int]] | None:
    head = f.read(64)
    if head[:5] != b"\x7fELF\x02":
        return None
    shoff, = struct.unpack_from("<Q", head, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    sections = [struct.unpack_from("<IIQQQQ", table, i * shentsize) for i in range(shnum)]
    f.seek(sections[shstrndx][4])
    names = f.read(sections[shstrndx][5])
    found = next((s for s in sections if names[s[0]:names.index(b"\0", s[0])] == b".nv_fatbin"), None)
    if found is None:
        return None
    offset, size = found[4], found[5]
    archs: set[tuple[str, int]] = set()
    pos = offset
    while pos + 16 <= offset + size:
        f.seek(pos)
        magic, _, header, body = struct.unpack("<IHHQ", f.read(16))
        if magic != _FATBIN_MAGIC:
            pos += 8  # containers are 8-byte aligned; skip padding
            continue
        entry = pos + header
        while entry < pos + header + body:
            f.seek(entry)
            raw = f.read(32)
            kind, _, entry_header, entry_size = struct.unpack_from("<HHIQ", raw)
            arch, = struct.unpack_from("<I", raw, 28)
            if kind in _KINDS:
                archs.add((_KINDS[kind], int(arch)))
            entry += entry_header + entry_size
        pos += header + body
    return frozenset(archs)


def missing_arch(loaded: Loaded, label: str, capability: tuple[int, int]) -> str | None:
    """Why `loaded` cannot run on a GPU of `capability`, from its fatbin table; None when it can (a
    cubin of the same major at or below the device's SM, or PTX at or below it) or cannot be told."""
    archs = fatbin_archs(loaded.file) if loaded.file else None
    if archs is None:
        return None
    sm = capability[0] * 10 + capability[1]
    if any(kind == "cubin" and a // 10 == capability[0] and a <= sm for kind, a in archs):
        return None
    if any(kind == "ptx" and a <= sm for kind, a in archs):
        return None
    have = ", ".join(f"sm_{a}" for a in sorted({a for _, a in archs})) or "no GPU code"
    return f"no sm_{sm} code in {label} (it has {have})"


__all__ = ["C_OPS", "DEEPSELECT", "KernelLibrary", "Loaded", "fatbin_archs", "has_op", "load", "missing_arch",
           "needs_own_process", "split_spec"]
