"""FlashInfer 0.7.4's deterministic calls (selectors/upstream/flashinfer074.py): registered by their
declaration alone, refused on the 0.7.2.post1 they were not read from, and, on a stand-in reporting 0.7.4,
called as SGLang calls FlashInfer with the deterministic flag on, on the radix path, passing checks 1-4."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from logitreplay.selectors.registry import available, build
from logitreplay.selectors.upstream import flashinfer074, loading
from tests import peer_standins
from tests.test_peers import CUDA, _case, _run

NAMES = ("flashinfer-ragged-det", "flashinfer-paged-det")


def _standin(root: Path, version: str) -> Iterator[object]:
    peer_standins.write(root, {**peer_standins.VERSIONS, "flashinfer-python": version})
    sys.path.insert(0, str(root))
    loading.forget()
    try:
        yield importlib.import_module("flashinfer.topk")
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] in ("flashinfer", "sglang", "sgl_kernel")]:
            del sys.modules[name]
        loading.forget()


@pytest.fixture
def fi074(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    yield from _standin(tmp_path, "0.7.4")


@pytest.mark.parametrize("name", NAMES)
def test_declared_is_registered_as_read_from_074(name: str) -> None:
    assert available()[name].startswith(f"{flashinfer074.__name__}:")
    assert build(name).declared.release.read_from == "0.7.4"


@pytest.mark.parametrize("name", NAMES)
def test_refuses_the_072_it_was_not_read_from(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for _ in _standin(tmp_path, "0.7.2.post1"):
        assert build(name).supports(_case(), CUDA) == (
            "flashinfer-python 0.7.2.post1 is not a version this adapter knows: it was read from 0.7.4 and takes "
            "0.7.4 <= version < 0.7.5")


@pytest.mark.parametrize("name", NAMES)
def test_calls_sglangs_call_deterministic_on_the_radix_path(name: str, fi074: object) -> None:
    assert build(name).supports(_case(), CUDA) is None
    assert _run(name, _case()) == ([], None)
    [(_, args)] = fi074.CALLS  # type: ignore[attr-defined]
    assert (args["deterministic"], args["algo"], args["dsa_graph_safe"]) == (True, "default", True)
    assert "deterministic" in build(name).kernel_name(_case())


@pytest.mark.parametrize("name", NAMES)
def test_declines_what_the_radix_path_cannot_take(name: str, fi074: object) -> None:
    assert "takes k <= 2048" in (build(name).supports(_case(k=4096), CUDA) or "")
