"""Imports vLLM's released indexer modules from a pinned wheel's sources, with fakes at their edges.

`load(tree)` puts an import hook in front of `sys.meta_path` that answers every `vllm.*` import:
- a name in `REAL` is executed from the released file, unchanged: `sparse_attn_indexer` (the indexer op
  and its prefill chunk loop), `indexer_topk` (`deep_select_topk`, `SparseIndexerTopk`), the MLA
  indexer backend (the metadata dataclasses and `dense_logits_rows`), and DeepSeek V4.1's sparse-logits
  layer (`SparseMQAIndexer`), its kernels' Python (`sparse_mqa_logits`) and its backend's metadata;
- a name in `FAKES` is a module built by `edges.py`: the kernels (logits, K gather, top-k ops,
  DeepSelect, the fused MQA top-k), the forward context, the platform, the switches (`envs`), the
  collectives and the few helpers the real code calls on the tested path;
- any other `vllm.*` module is `Inert`: its names exist so that the real modules import (they subclass
  some, decorate with some, call a few at import time), each an `Inert` class that does nothing. A test
  path that reaches one computes nothing the tests' own recomputation would accept.
`vllm` itself is an empty package over the released directory with the release's `__version__`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import types
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.engine_fakes.made import Made

REAL = frozenset({
    "vllm.model_executor.layers.sparse_attn_indexer",
    "vllm.model_executor.layers.indexer_topk",
    "vllm.v1.attention.backends.mla.indexer",
    "vllm.model_executor.layers.sparse_mqa_indexer",
    "vllm.model_executor.kernels.attention.dsa.sparse_mqa_logits",
    "vllm.v1.attention.backends.mla.sparse_indexer",
})


class _InertMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return inert(f"{cls.__name__}.{name}")

    def __getitem__(cls, key: Any) -> Any:
        return cls

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator: the function stays itself
        return super().__call__()

    def __or__(cls, other: Any) -> Any:
        return cls

    __ror__ = __or__


class Inert(metaclass=_InertMeta):
    """A name outside the tested path: importable, subclassable, usable as a decorator."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return args[0] if len(args) == 1 and not kwargs and callable(args[0]) else self

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return inert(name)

    def __getitem__(self, key: Any) -> Any:
        return self


def inert(name: str) -> type:
    return _InertMeta(name.rpartition(".")[2] or "Inert", (Inert,), {})


class InertModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or any((Path(d) / name).is_dir() or (Path(d) / f"{name}.py").exists()
                                        for d in getattr(self, "__path__", ())):
            raise AttributeError(name)  # a submodule: imported as one, never an inert name
        value = inert(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, tree: Path, fakes: dict[str, Any]) -> None:
        self.tree = tree
        self.fakes = fakes

    def find_spec(self, name: str, path: Sequence[str] | None, target: Any = None) -> Any:
        if not name.startswith("vllm."):
            return None
        parts = name.split(".")
        if name in self.fakes:
            return importlib.machinery.ModuleSpec(name, Made(self.fakes[name]), is_package=True)
        if name in REAL:
            return importlib.util.spec_from_file_location(name, self.tree.joinpath(*parts[:-1], parts[-1] + ".py"))
        spec = importlib.machinery.ModuleSpec(name, Made(InertModule), is_package=True)
        directory = self.tree.joinpath(*parts)
        spec.submodule_search_locations = [str(directory)] if directory.is_dir() else []
        return spec


def release_version(tree: Path) -> str:
    """`__version__` as the wheel's `vllm/_version.py` states it (read, not run)."""
    text = (tree / "vllm" / "_version.py").read_text()
    found = re.search(r"__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)['\"]", text) or re.search(
        r"__version__\s*=\s*['\"]([^'\"]+)['\"]", text)
    assert found, "no __version__ in vllm/_version.py"
    return found.group(1)


def unload() -> None:
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Finder)]


@contextmanager
def load(tree: Path, fakes: dict[str, Any]) -> Iterator[types.ModuleType]:
    """The released `vllm` of `tree` importable for the block (with `fakes`: module name -> a function
    building that module), dropped from sys.modules afterwards."""
    unload()
    package = types.ModuleType("vllm")
    package.__path__ = [str(tree / "vllm")]
    package.__version__ = release_version(tree)  # type: ignore[attr-defined]
    sys.modules["vllm"] = package
    sys.meta_path.insert(0, _Finder(tree, fakes))
    try:
        yield package
    finally:
        unload()
