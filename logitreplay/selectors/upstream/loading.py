"""The one way an adapter finds its kernel: a Python package imported as installed or from a folder, or
a torch extension library found where its package registers it or loaded from a file; whether the code
found has anything for this GPU; and which version it is.

A `Source` says what an adapter loads. `find(source, path)` returns where it came from (`Loaded`) or one
line saying why it cannot be used:
- installed (`path` None): the package's modules imported in order (a library may be registered by one
  of several modules across releases, newest layout first; it is proven by its probe op);
- a folder: put first on sys.path, then imported the same way;
- a file (a library only): `torch.ops.load_library(path)`, which must register the probe op.

One process holds one copy of a package or library: a second folder for a module already imported from
elsewhere, or a second build of ops already registered, is refused with the advice to run it in a
process of its own (`--isolate`); the replay command does that itself for selectors of one family from
different sources, or one package from two folders, in as few processes as keep them apart
(`process_groups` in registry.py).

Whether a library has code for the GPU is read once from its fatbin table (the `.nv_fatbin` section of
the ELF file: one entry per cubin or PTX, each naming its SM architecture), so an adapter says "no sm_90
code in vllm._deepselect_C (it has sm_100)" instead of launching a kernel that cannot run.
"""

from __future__ import annotations

import functools
import glob
import importlib
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import struct
import sys
from dataclasses import dataclass
from typing import BinaryIO

import torch

from logitreplay.errors import one_line


@dataclass(frozen=True)
class Source:
    """What an adapter loads.

    `modules`: the modules to import, newest layout first (a package has one). `install`: what the
    "not installed" line tells the user to install. `dist`: the distribution whose version is read.
    `label`: what the architecture probe and the clash message name. A library also has the op
    `namespace` and the `probe_op` whose presence proves it registered (then a path may name its file).
    `binary`: the file the architecture probe reads, as a glob beside the imported module ("" for the
    module's own file); None when the code is compiled for the GPU it runs on (JIT)."""

    modules: tuple[str, ...]
    install: str
    dist: str
    label: str
    namespace: str | None = None
    probe_op: str | None = None
    binary: str | None = ""

    @property
    def top(self) -> str:
        return self.modules[0].split(".")[0]

    @property
    def family(self) -> str:
        """One process holds one copy of this: a library by its label, a package by its top module."""
        return self.label if self.namespace is not None else self.top


@dataclass(frozen=True)
class Loaded:
    """Where a kernel came from: the module that registered it, the folder or file loaded; the shared
    library file (for the architecture probe; None when unknown or JIT-built); its version (None when it
    cannot be told, a bare library file)."""

    source: str
    file: str | None
    version: str | None = None


def has_op(namespace: str, op: str) -> bool:
    try:
        getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return False
    return True


def find(source: Source, path: str | None = None) -> Loaded | str:
    """Load `source` as installed, from the folder or library file `path`; where it came from, or why
    it cannot be used."""
    if path is None:
        return _import(source, None)
    path = os.path.abspath(path)
    if os.path.isfile(path) and source.namespace is not None:
        return _load_file(source, path)
    if os.path.isdir(path):
        return _import(source, path)
    if source.namespace is not None and path.endswith(".so"):
        return f"no kernel library at {path}"
    return f"no folder {path} to import {source.modules[0]} from"


# The source each library or package family was loaded from in this process ("installed", or a path).
_SOURCES: dict[str, str] = {}


def _clash(source: Source, where: str) -> str | None:
    """A library's second build (a package's second copy is told by `sys.modules`, in `_import`)."""
    held = _SOURCES.get(source.family) if source.namespace is not None else None
    if held is None or held == where:
        return None
    return (f"this process already holds {source.label} from {held}; a second build of the same ops cannot "
            "be loaded beside it (run it in a process of its own: --isolate)")


@functools.cache
def _import(source: Source, path: str | None) -> Loaded | str:
    top = source.top
    if path is not None:
        held = sys.modules.get(top)
        # a namespace package (a staged library folder without __init__.py) has a __path__, no __file__
        origin = str(getattr(held, "__file__", None) or next(iter(getattr(held, "__path__", None) or []), "?"))
        if held is not None and not origin.startswith(path):
            return (f"this process already imported {top} from {origin}; another copy "
                    "cannot be loaded beside it (run it in a process of its own: --isolate)")
        if path not in sys.path:
            sys.path.insert(0, path)
    if importlib.util.find_spec(top) is None:
        return f"not installed (pip install {source.install})"
    where = path or "installed"
    clash = _clash(source, where)
    if clash:
        return clash
    problems: list[str] = []
    for module in source.modules:
        try:
            if source.namespace is not None and importlib.util.find_spec(module) is None:
                continue  # a layout this release does not have: the probe op decides
            mod = importlib.import_module(module)
        except Exception as e:  # a broken install, or a build against another torch (undefined symbols)
            problems.append(f"{module} does not import{_built_for(source, path)} "
                            f"({type(e).__name__}: {one_line(e, 160)})")
            continue
        if source.namespace is not None and source.probe_op is not None and \
                not has_op(source.namespace, source.probe_op):
            continue
        _SOURCES[source.family] = where
        file = getattr(mod, "__file__", None)
        return Loaded(path or module, _binary(source, file), _version(source, path, mod))
    if problems:
        return "; ".join(problems)
    return (f"the installed {top} registers no torch.ops.{source.namespace}.{source.probe_op} "
            f"(looked in {', '.join(source.modules)})")


@functools.cache
def _load_file(source: Source, path: str) -> Loaded | str:
    namespace, op = source.namespace, source.probe_op or ""
    clash = _clash(source, path)
    if clash:
        return clash
    if has_op(str(namespace), op):
        return (f"torch.ops.{namespace}.{op} is already registered in this process, so {path} cannot be "
                "loaded beside it (run it in a process of its own: --isolate)")
    try:
        torch.ops.load_library(path)
    except Exception as e:
        return f"{path} does not load ({type(e).__name__}: {one_line(e, 160)})"
    if not has_op(str(namespace), op):
        return f"{path} registers no torch.ops.{namespace}.{op}"
    _SOURCES[source.family] = path
    return Loaded(path, path, None)


def forget() -> None:
    """Forget what was found (not what was imported or registered: that stays for the process)."""
    _import.cache_clear()
    _load_file.cache_clear()
    _SOURCES.clear()


def _binary(source: Source, file: str | None) -> str | None:
    if source.binary is None or file is None:
        return None
    if source.binary == "":
        return file
    return next(iter(sorted(glob.glob(os.path.join(os.path.dirname(file), source.binary)))), None)


def _version(source: Source, path: str | None, module: object) -> str | None:
    """The version of what was imported: the distribution's metadata (installed, or a `*.dist-info`
    beside the package in the folder given), else the package's `__version__`."""
    if path is None:
        try:
            return importlib.metadata.version(source.dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    else:
        found = folder_versions(path).get(dist_key(source.dist))
        if found is not None:
            return found
    top = sys.modules.get(source.top)
    found = getattr(top, "__version__", None) or getattr(module, "__version__", None)
    return str(found) if found else None


def _torch_pin(source: Source, path: str | None) -> tuple[str, str] | None:
    """The release's version and the torch it requires exactly (`Requires-Dist: torch==X` in its metadata,
    installed or in the folder `path`), or None when it names none."""
    try:
        if path is None:
            meta = importlib.metadata.metadata(source.dist)
        else:
            info = _dist_infos(path).get(dist_key(source.dist))
            if info is None:
                return None
            meta = importlib.metadata.PathDistribution(pathlib.Path(info[1])).metadata
    except (importlib.metadata.PackageNotFoundError, OSError):
        return None
    pins = [m.group(1) for r in (meta.get_all("Requires-Dist") or [])
            for m in [re.fullmatch(r"torch\s*==\s*([0-9][^;\s]*)\s*", r)] if m]
    version = (meta.get_all("Version") or [None])[0]
    return (str(version), pins[0]) if pins and version else None


def _built_for(source: Source, path: str | None) -> str:
    """Why a release built for another torch fails to import, when its metadata says so ("" otherwise):
    its library then imports symbols this torch does not export."""
    pin = _torch_pin(source, path)
    running = torch.__version__.split("+")[0]
    if pin is None or pin[1] == running:
        return ""
    return f": {source.dist} {pin[0]} is built for torch {pin[1]}, this is torch {running}"


def dist_key(dist: str) -> str:
    """A distribution's name as its `*.dist-info` folder spells it, in lower case ("sglang-kernel" and
    "sglang_kernel" are one)."""
    return re.sub(r"[-_.]+", "_", dist).lower()


def _dist_infos(path: str) -> dict[str, tuple[str, str]]:
    """`dist_key` -> (version, the `*.dist-info` folder) of each distribution a folder holds."""
    found: dict[str, tuple[str, str]] = {}
    for info in sorted(glob.glob(os.path.join(path, "*.dist-info"))):
        name, _, version = os.path.basename(info)[: -len(".dist-info")].rpartition("-")
        if name and version:
            found[dist_key(name)] = (version, info)
    return found


def folder_versions(path: str) -> dict[str, str]:
    """The distributions a folder holds (`NAME-VERSION.dist-info` beside their packages, as pip's
    `--target` and the staging scripts lay them out), by `dist_key`, with their versions."""
    return {key: version for key, (version, _) in _dist_infos(path).items()}


def installed_version(source: Source) -> str | None:
    """The installed distribution's version, read from its metadata without importing it; None when it is
    not installed."""
    try:
        return importlib.metadata.version(source.dist)
    except importlib.metadata.PackageNotFoundError:
        return None


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


__all__ = ["Loaded", "Source", "dist_key", "fatbin_archs", "find", "folder_versions", "forget", "has_op",
           "installed_version", "missing_arch"]
