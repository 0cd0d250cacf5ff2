"""vllm/forward_context.py: the per-step context the indexer reads its metadata from."""

import contextlib
from dataclasses import dataclass
from typing import Any


@dataclass
class ForwardContext:
    attn_metadata: Any
    cudagraph_runtime_mode: str = "NONE"


_forward_context: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    assert _forward_context is not None, "Forward context is not set."
    return _forward_context


@contextlib.contextmanager
def set_forward_context(attn_metadata: Any):
    global _forward_context
    prev, _forward_context = _forward_context, ForwardContext(attn_metadata)
    try:
        yield
    finally:
        _forward_context = prev
