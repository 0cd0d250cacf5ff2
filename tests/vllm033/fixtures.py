"""The fixtures every test of the vLLM stand-in shares (registered in tests/conftest.py): the stand-in
vLLM 0.33 tree on `sys.path` for a module's tests, and a plugin state reset around each test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from logitreplay.capture import serving, vllm_plugin
from tests.vllm033.steps import vllm_on_path


@pytest.fixture(scope="module")
def vllm033() -> Iterator[Any]:
    with vllm_on_path() as vllm:
        yield vllm


@pytest.fixture
def fresh_plugin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """TP rank 0 of 1, no recorded model, no cached lookups; the capture a test installed is removed."""
    import vllm.distributed as dist
    from vllm.model_executor.layers import indexer_topk

    monkeypatch.setattr(dist, "_TP_RANK", 0)
    monkeypatch.setattr(dist, "_TP_SIZE", 1)
    monkeypatch.delenv(serving.ENV_MODEL, raising=False)
    vllm_plugin._model_facts.cache_clear()
    indexer_topk.get_indexer_topk.cache_clear()
    yield
    if serving._active is not None:
        serving._active.uninstall()
