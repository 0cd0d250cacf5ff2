"""Shared test configuration: tests marked `gpu` run only where CUDA is available; the vLLM stand-in's
fixtures (tests/vllm033/fixtures.py); the pinned upstream sources (tests/upstream_wheels.py)."""

from __future__ import annotations

import pytest
import torch

pytest_plugins = ["tests.vllm033.fixtures", "tests.upstream_wheels", "tests.engine_fakes.vllm.checks"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
