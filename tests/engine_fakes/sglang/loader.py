"""Imports the released SGLang modules from the pinned wheel's sources, with fakes at their edges.

`load(tree)` puts an import hook in front of `sys.meta_path` that answers every `sglang.*` (and the kernel
packages `sgl_kernel`, `deep_gemm`, `flashinfer`) import this way:
- a name in `REAL` is executed from the released file, unchanged (the indexer, its metadata and top-k
  backend, the environment switches, the runtime context, the forward context, capture mode, ...);
- a name in `FAKES` is one of this package's modules (written from the facts of the names, signatures and
  semantics SGLang uses): the kernels (logits, top-k, transforms), the platform probes, the few layers a
  real module subclasses or calls at import time;
- a package on the way to a real module is an empty package over the released directory (its
  `__init__` is not run: SGLang's top-level one imports the whole server);
- any other `sglang.*` module a real module imports is a `Boundary` module: its names exist (so the
  imports succeed) but each is an `Outside` object that fails loudly, naming itself, if the code under
  test ever calls it, reads from it or subclasses it. Nothing outside the tested path is silently
  emulated.

`unload()` removes the hook and every module it served, so tests of another SGLang tree (or none) start
clean.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.engine_fakes.made import Made

_ENGINE_ROOTS = ("sglang", "sgl_kernel", "deep_gemm", "flashinfer")

# The released modules the tests run.
REAL = frozenset({
    "sglang.version",
    "sglang._version",
    "sglang.srt.environ",
    "sglang.srt.runtime_context",
    "sglang.srt.layers.attention.dsa.dsa_indexer",
    "sglang.srt.layers.attention.dsa.dsa_indexer_metadata",
    "sglang.srt.layers.attention.dsa.dsa_topk_backend",
    "sglang.srt.layers.attention.dsa.dsa_backend_mtp_precompute",
    "sglang.srt.layers.attention.mqa_logits_utils",
    "sglang.srt.layers.attention.dsa.paged_mqa_logits_backend",
    "sglang.srt.model_executor.forward_context",
    "sglang.srt.model_executor.runner_utils.capture_mode",
    "sglang.srt.plugins",
    "sglang.srt.plugins.hook_registry",
    "sglang.kernels.ops.attention.dsa",
    "sglang.kernels.ops.attention.dsa.paged_mqa_logits",
})
# Released packages whose own modules the real ones import (their `__init__` is light): real as a prefix.
REAL_PREFIXES = ("sglang.srt.arg_groups",)

_HERE = "tests.engine_fakes.sglang"
FAKES = {
    "sglang.srt.utils": f"{_HERE}.platform",
    "sglang.srt.utils.common": f"{_HERE}.platform",
    "sglang.srt.utils.custom_op": f"{_HERE}.platform",
    "sglang.srt.compilation.compilation_config": f"{_HERE}.platform",
    "sglang.kernels.ops.quantization.fp8_kernel": f"{_HERE}.platform",
    "sglang.kernels.fused_op": f"{_HERE}.layers",
    "sglang.srt.layers.layernorm": f"{_HERE}.layers",
    "sglang.srt.layers.attention.dsa.dsa_npu_indexer": f"{_HERE}.layers",
    "sglang.srt.layers.attention.dsa.utils": f"{_HERE}.kernels",
    "sglang.srt.model_executor.runner": f"{_HERE}.runner",
    "sglang.srt.model_executor.model_runner": f"{_HERE}.runner",
    "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context": f"{_HERE}.graphs",
    "sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph": f"{_HERE}.graphs",
    "sglang.srt.model_executor.forward_batch_info": f"{_HERE}.batch",
    "sglang.kernels.ops.attention.dsv4.topk": f"{_HERE}.topk",
    "sgl_kernel": f"{_HERE}.topk",
    "flashinfer": f"{_HERE}.topk",
    "deep_gemm": f"{_HERE}.kernels",
}


class Outside:
    """A name a real module imports from a module outside the tested path. Importing it is fine; using it
    is a test that strayed off its boundary, and says so."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _stray(self, what: str) -> RuntimeError:
        return RuntimeError(f"{self._name} ({what}) is outside the SGLang code these tests run: add a fake "
                            f"for it in tests/engine_fakes/sglang or keep the test off that path")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._stray("called")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._stray(f"attribute {name} read")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        raise self._stray("subclassed")

    def __repr__(self) -> str:
        return f"<outside {self._name}>"


class Boundary(types.ModuleType):
    """A module outside the tested path: every name is an `Outside`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = Outside(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, tree: Path) -> None:
        self.tree = tree
        self.served: set[str] = set()

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if name.split(".")[0] not in _ENGINE_ROOTS:
            return None
        self.served.add(name)
        if name in FAKES:
            return importlib.machinery.ModuleSpec(name, Made(self._fake), is_package=True)
        parts = name.split(".")
        directory, file = self.tree.joinpath(*parts), self.tree.joinpath(*parts[:-1], parts[-1] + ".py")
        real = name in REAL or name.startswith(REAL_PREFIXES)
        if real and file.exists():
            return importlib.util.spec_from_file_location(name, file)
        if real and (directory / "__init__.py").exists():
            return importlib.util.spec_from_file_location(name, directory / "__init__.py",
                                                          submodule_search_locations=[str(directory)])
        if directory.is_dir() and any(r.startswith(name + ".") for r in REAL):
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(directory)]
            return spec
        return importlib.machinery.ModuleSpec(name, Made(Boundary), is_package=True)

    def _fake(self, name: str) -> types.ModuleType:
        fake = importlib.import_module(FAKES[name])
        directory = self.tree.joinpath(*name.split("."))
        if directory.is_dir() and not hasattr(fake, "__path__"):
            fake.__path__ = [str(directory)]  # type: ignore[attr-defined]  # real submodules load under it
        return fake


_finder: _Finder | None = None


def load(tree: Path) -> types.ModuleType:
    """Make the released SGLang under `tree` importable (see the module's docstring); returns `sglang`
    with its `__version__`."""
    global _finder
    unload()
    _finder = _Finder(tree)
    sys.meta_path.insert(0, _finder)
    sglang = importlib.import_module("sglang")
    sglang.__version__ = importlib.import_module("sglang.version").__version__  # type: ignore[attr-defined]
    return sglang


def unload() -> None:
    global _finder
    if _finder is None:
        return
    sys.meta_path.remove(_finder)
    for name in [m for m in sys.modules if m.split(".")[0] in _ENGINE_ROOTS]:
        del sys.modules[name]
    for name in FAKES.values():
        sys.modules.pop(name, None)  # a fake keeps no state across trees
    _finder = None


@contextmanager
def loaded(tree: Path) -> Iterator[types.ModuleType]:
    try:
        yield load(tree)
    finally:
        unload()


__all__ = ["FAKES", "REAL", "Boundary", "Outside", "load", "loaded", "unload"]
