"""Shared test configuration: tests marked `gpu` run only where CUDA is available; the pinned upstream
sources (tests/upstream_wheels.py) and the released vLLM loaded with its fakes (tests/engine_fakes/vllm)."""

from __future__ import annotations

import pytest
import torch

pytest_plugins = ["tests.upstream_wheels", "tests.engine_fakes.vllm.checks"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
