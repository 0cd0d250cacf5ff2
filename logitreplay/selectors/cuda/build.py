"""Build the bundled CUDA kernels (`*.cu` in this folder) on first use and load them.

Each kernel family is compiled by the machine's own `nvcc` into a torch-free shared library for the
exact architecture of the device (sm_90a for compute capability 9.0, sm_100a for 10.0: the `a` targets
allow the chip's own instructions), and called through `ctypes` with the C interface of `topk_api.h`,
bound in abi.py: this module only compiles, caches and loads. Why ctypes and not a torch C++ extension:
a plain `nvcc` build of one `.cu` takes seconds while a torch extension compiles torch's headers (close
to a minute), and the library does not depend on the C++ ABI of whichever torch is installed, so one
build serves every torch of the same machine. Torch stays the caller: it owns the memory and passes raw
device pointers and the current stream (`torch.cuda.current_stream().cuda_stream`), which keeps
launches capturable in CUDA graphs.

Builds are cached in a user cache directory (`LOGITREPLAY_CACHE`, else `$XDG_CACHE_HOME/logitreplay`,
else `~/.cache/logitreplay`) under a hash of everything that determines the binary: the sources
(headers included), the flags, the `nvcc` version and the architecture. A build writes to a temporary
file and renames it into place, so concurrent builders and killed builds never leave a half library.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from logitreplay.errors import BuildError

SOURCE_DIR = Path(__file__).resolve().parent
FLAGS: tuple[str, ...] = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo")
# The work build: the kernels also keep topk_api.h's per-row work record (for the GPU tests, which
# compare it with the CPU models); a library of its own, so the default build has none of its code.
WORK_FLAGS: tuple[str, ...] = ("-DLR_WORK_RECORD",)
# The deterministic build (the `-det` selectors): lowest indices among the ties at the k-th value, output
# in ascending index order (common.cuh, "deterministic mode"); a library of its own, as the work build.
DET_FLAGS: tuple[str, ...] = ("-DLR_DETERMINISTIC",)
# The name part of each variant's library, for the flags that make it.
_VARIANTS = ((WORK_FLAGS, "-work"), (DET_FLAGS, "-det"))
DEFAULT_NVCC = Path("/usr/local/cuda/bin/nvcc")
# Compute capabilities from 9.0 on have architecture-specific (`a`) targets.
_FIRST_ARCH_SPECIFIC = 9


def kernel_names() -> list[str]:
    """Every bundled kernel family: one `<name>.cu` per family."""
    return sorted(p.stem for p in SOURCE_DIR.glob("*.cu"))


@dataclass(frozen=True)
class Toolchain:
    nvcc: Path
    version: str  # e.g. "13.0.88"
    codes: tuple[str, ...]  # real architectures this nvcc can build, e.g. ("sm_80", "sm_90", ...)


def find_nvcc() -> Path:
    """`$CUDA_HOME/bin/nvcc`, else `nvcc` on PATH, else the default toolkit location."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(home) / "bin" / "nvcc"] if home else []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(DEFAULT_NVCC)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise BuildError("nvcc not found: install the CUDA toolkit and set CUDA_HOME to it (or put nvcc on PATH)")


@functools.cache
def toolchain(nvcc: Path | None = None) -> Toolchain:
    exe = nvcc or find_nvcc()
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, check=True).stdout
        codes = subprocess.run([str(exe), "--list-gpu-code"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise BuildError(f"{exe} does not run ({e}); set CUDA_HOME to a working CUDA toolkit") from None
    return Toolchain(exe, parse_nvcc_version(out), tuple(codes.split()))


def parse_nvcc_version(text: str) -> str:
    m = re.search(r"V(\d+\.\d+\.\d+)", text) or re.search(r"release (\d+\.\d+)", text)
    if not m:
        raise BuildError("cannot read the nvcc version from `nvcc --version`; set CUDA_HOME to a CUDA toolkit")
    return m.group(1)


def arch_for(capability: tuple[int, int]) -> str:
    """The exact target for a compute capability: (9, 0) -> "sm_90a", (8, 6) -> "sm_86"."""
    major, minor = capability
    return f"sm_{major}{minor}" + ("a" if major >= _FIRST_ARCH_SPECIFIC else "")


def check_arch(arch: str, tc: Toolchain) -> None:
    """Refuse an architecture this nvcc cannot build, saying what to do."""
    if not re.fullmatch(r"sm_\d+a?", arch):
        raise BuildError(f"architecture {arch!r}: expected sm_<major><minor>[a], e.g. sm_90a")
    if arch.rstrip("a") not in tc.codes:
        raise BuildError(f"nvcc {tc.version} cannot build for {arch} (it supports {', '.join(tc.codes)}); "
                         "install a CUDA toolkit that supports this GPU and set CUDA_HOME to it")


def device_arch(device: torch.device | str | None = None) -> str:
    if not torch.cuda.is_available():
        raise BuildError("no CUDA device visible to torch; name the target architecture instead (build-kernels --arch sm_90a)")
    return arch_for(torch.cuda.get_device_capability(device))


def gencode(arch: str) -> str:
    # The -gencode form assembles the `a` targets alone (the -arch shorthand also runs a generic pass).
    num = arch[3:]
    return f"-gencode=arch=compute_{num},code=sm_{num}"


def sources(name: str) -> list[Path]:
    """The kernel's `.cu` and every header of this folder (any of them may be included): what the cache
    key hashes."""
    cu = SOURCE_DIR / f"{name}.cu"
    if not cu.is_file():
        known = ", ".join(kernel_names()) or "none"
        raise BuildError(f"kernel {name!r}: no {cu.name} in the package (bundled kernels: {known})")
    return [cu, *sorted([*SOURCE_DIR.glob("*.cuh"), *SOURCE_DIR.glob("*.h")])]


def cache_key(name: str, arch: str, nvcc_version: str, flags: tuple[str, ...] = FLAGS) -> str:
    h = hashlib.sha256()
    for part in (name, arch, nvcc_version, *flags):
        h.update(part.encode() + b"\0")
    for src in sources(name):
        h.update(src.name.encode() + b"\0" + src.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def cache_dir() -> Path:
    root = os.environ.get("LOGITREPLAY_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "logitreplay"


def library_path(name: str, arch: str, tc: Toolchain, extra: tuple[str, ...] = ()) -> Path:
    variant = "".join(part for flags, part in _VARIANTS if set(flags) <= set(extra))
    return cache_dir() / "kernels" / f"{name}{variant}-{arch}-{cache_key(name, arch, tc.version, FLAGS + extra)}.so"


def build(name: str, arch: str | None = None, extra: tuple[str, ...] = ()) -> Path:
    """The path of the kernel's shared library for `arch` (default: the current device's), built if absent;
    `extra` flags (WORK_FLAGS, DET_FLAGS) make a variant of its own."""
    tc = toolchain()
    arch = arch or device_arch()
    check_arch(arch, tc)
    lib = library_path(name, arch, tc, extra)
    if lib.is_file():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=lib.parent, prefix=lib.name + ".", suffix=".tmp")
    os.close(fd)
    cmd = [str(tc.nvcc), *FLAGS, *extra, gencode(arch), "-o", tmp, str(SOURCE_DIR / f"{name}.cu")]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            log = lib.with_suffix(".log")
            log.write_text(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
            first = next((ln for ln in proc.stderr.splitlines() if "error" in ln), proc.stderr.strip()[:200])
            raise BuildError(f"kernel {name}: nvcc failed for {arch}: {first.strip()} (full log: {log})")
        os.replace(tmp, lib)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return lib


@functools.cache
def load(name: str, arch: str | None = None, extra: tuple[str, ...] = ()) -> ctypes.CDLL:
    """The kernel's shared library, loaded (built first if not cached); abi.py binds its entry points."""
    path = build(name, arch, extra)
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise BuildError(f"kernel {name}: cannot load {path} ({e}); delete it to rebuild") from None
