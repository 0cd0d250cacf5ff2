"""Which code made a measurement: a digest of each bundled kernel's sources, the version of each peer.

A replay report (and every bench JSON that probes its `environment`) records, under
`environment.kernel_sources`, one `sha256:<hex>` per bundled kernel over the files that define it on
that device kind: on CUDA its `.cu`, every header of `cuda/` and the Python that builds, binds and
launches it (`build.py`, `abi.py`, `kernels.py`); on CPU the models' module (`cpu_models.py`). A peer's
package version goes under `environment.peer_versions`. `bench/claims.py` compares the recorded
digests with the tree's, so a table whose data came from other kernel sources says so instead of being
presented as current (docs/design.md, decision 16).

Every function takes the folder of the selectors package as `base`, so the digests of another tree (a
checkout being rendered, a test's edited copy) are computed from its own files.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from logitreplay.selectors.registry import split_spec
from logitreplay.selectors.upstream import catalog
from logitreplay.selectors.upstream.loading import dist_key, folder_versions, installed_version

PACKAGE = Path(__file__).resolve().parent
BUNDLED = ("native", "deepselect", "split")
# What `auto` dispatches to: a report that ran it ran every bundled kernel.
DISPATCHERS = ("auto",)
# The Python that builds (flags, architecture), binds and launches (grid, workspace) the CUDA kernels.
CUDA_LAUNCH = ("cuda/abi.py", "cuda/build.py", "cuda/kernels.py")
# The CPU models, and the reader of the kernels' configs they take their constants from.
CPU_MODELS = ("cpu_models.py", "kernel_config.py")


def kernel_files(name: str, device_kind: str, base: Path = PACKAGE) -> list[str]:
    """The files (relative to `base`) that define bundled kernel `name` on `device_kind` ("cuda" or "cpu")."""
    if device_kind != "cuda":
        return [*CPU_MODELS, f"cuda/{name}_config.h"]
    headers = sorted(p.relative_to(base).as_posix() for pattern in ("cuda/*.cuh", "cuda/*.h")
                     for p in base.glob(pattern))
    return [f"cuda/{name}.cu", *headers, *CUDA_LAUNCH]


def digest(files: list[str], base: Path = PACKAGE) -> str:
    """`sha256:<hex>` over the files' names and bytes, in the order given."""
    h = hashlib.sha256()
    for rel in files:
        h.update(rel.encode() + b"\0" + (base / rel).read_bytes() + b"\0")
    return f"sha256:{h.hexdigest()}"


def kernel_sources(device_kind: str, base: Path = PACKAGE) -> dict[str, str]:
    """Each bundled kernel's source digest on `device_kind`, as a replay records it."""
    return {name: digest(kernel_files(name, device_kind, base), base) for name in BUNDLED}


def tree_digests(base: Path = PACKAGE) -> dict[str, set[str]]:
    """Each bundled kernel's digests in a tree, CUDA and CPU: a recorded digest equal to either is current
    (the two cover different files, so they cannot be confused)."""
    return {name: {digest(kernel_files(name, kind, base), base) for kind in ("cuda", "cpu")} for name in BUNDLED}


def bundled_in(selectors: list[str]) -> list[str]:
    """The bundled kernels a run of these selectors ran (all of them where `auto` dispatched; a `-det`
    mode is its kernel's sources too)."""
    if any(s in DISPATCHERS for s in selectors):
        return list(BUNDLED)
    return [s for s in BUNDLED if s in selectors or f"{s}-det" in selectors]


def peer_version(spec: str) -> str | None:
    """The package version of an upstream peer's selector spec (`flashinfer-python 0.7.2`, read from the
    installed distribution's metadata without importing it), or the library or folder it was given
    (`from _C_stable_libtorch.abi3.so`), with the release a staged folder holds (`vllm 0.34.0 from
    vllm-0.34.0`); None for a name that is no peer."""
    name, path = split_spec(spec)
    entry = catalog.adapters().get(name)
    if entry is None:
        return None
    source = entry.declared.release.source
    if path is not None:
        staged = folder_versions(path).get(dist_key(source.dist)) if Path(path).is_dir() else None
        return f"{source.dist} {staged} from {Path(path).name}" if staged else f"from {Path(path).name}"
    version = installed_version(source)
    return f"{source.dist} {version}" if version else f"{source.dist} not installed"


def peer_versions(specs: list[str]) -> dict[str, str]:
    """Each peer of `specs` and its version (`peer_version`), by the spec's name."""
    out = {}
    for spec in specs:
        version = peer_version(spec)
        if version is not None:
            out[spec] = version
    return out


__all__ = ["BUNDLED", "bundled_in", "digest", "kernel_files", "kernel_sources", "peer_version", "peer_versions",
           "tree_digests"]
