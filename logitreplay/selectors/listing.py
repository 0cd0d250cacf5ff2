"""What `logitreplay selectors` lists: every registered name with what it is, whether it can run here
and why not, the device it runs on, the dtypes, top_k range and row layouts it takes, and, for an
adapter of a production kernel, the version it was read from and the one installed.

By default nothing is imported: an adapter's package is looked up (`find_spec` of its top module and
its distribution's metadata), so listing is fast and safe on any machine. `check=True` loads each
adapter's kernel as a replay would (importing its package, loading its library) and reads its fatbin
against the CUDA device when there is one.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass

import torch

from logitreplay.selectors.registry import BUILTINS, available
from logitreplay.selectors.upstream import catalog
from logitreplay.selectors.upstream.base import ROW_LAYOUTS, Declared
from logitreplay.selectors.upstream.loading import Loaded, find, installed_version, missing_arch


@dataclass(frozen=True)
class Listed:
    """One registered name, as listed."""

    name: str
    kind: str  # "built-in", "adapter" or "plugin"
    status: str  # "ok", "not installed", "refused", "unusable" or "unknown"
    why: str  # what stands behind the status (the version found, the install line, the refusal)
    device: str
    dtypes: tuple[str, ...]
    k: str
    layouts: tuple[str, ...]
    version: str | None = None  # the installed version of an adapter's package
    read_from: str | None = None
    accepts: str | None = None
    package: str | None = None
    factory: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def k_range(declared: Declared) -> str:
    """`1-2048`, `2048`, `512 1024 2048` or `>=1`."""
    if declared.k_only:
        return " ".join(str(k) for k in declared.k_only)
    low, high = declared.k
    if high is None:
        return f">={low}"
    return str(low) if low == high else f"{low}-{high}"


def _adapter(entry: catalog.Entry, check: bool) -> Listed:
    d = entry.declared
    release = d.release
    source = release.source
    version = installed_version(source)
    status, why = "ok", f"installed {version}" if version else "found, version unknown"
    if check:
        found = find(source)
        if isinstance(found, str):
            status, why = ("not installed" if found.startswith("not installed") else "unusable"), found
        else:
            version = found.version or version
            why = f"loaded {version}" if version else "loaded, version unknown"
            refused = release.refuses(version) or _arch(found, source.label)
            if refused:
                status, why = "refused", refused
    elif importlib.util.find_spec(source.top) is None:
        status, why = "not installed", f"pip install {source.install}"
    elif refused := release.refuses(version):
        status, why = "refused", refused
    return Listed(d.name, "adapter", status, why, "cuda", d.dtypes, k_range(d), d.layouts, version,
                  release.read_from, f">={release.accepts[0]},<{release.accepts[1]}", source.dist, entry.factory)


def _arch(found: Loaded, label: str) -> str | None:
    if not torch.cuda.is_available():
        return None
    return missing_arch(found, label or found.source, torch.cuda.get_device_capability())


def listing(check: bool = False) -> list[Listed]:
    """Every registered name: built-ins, adapters, plugins, in that order. The built-ins take either dtype,
    any top_k and every layout on CPU; on CUDA the bundled kernels say per case when a top_k is above
    what their build selects."""
    adapters = catalog.adapters()
    out = [Listed(name, "built-in", "ok", "bundled", "cpu, cuda", ("float32", "bfloat16"), ">=1", ROW_LAYOUTS,
                  factory=spec) for name, spec in BUILTINS.items()]
    out += [_adapter(entry, check) for entry in adapters.values()]
    out += [Listed(name, "plugin", "unknown", "an entry point: its own supports() says per case", "?", (), "?", (),
                   factory=spec) for name, spec in available().items() if name not in BUILTINS and name not in adapters]
    return out


__all__ = ["Listed", "k_range", "listing"]
