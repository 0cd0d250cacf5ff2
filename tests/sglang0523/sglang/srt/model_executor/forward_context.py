"""`get_token_to_kv_pool()`: the KV pool of the forward running now (set by the model runner's forward and
by the decode CUDA-graph runner around its warm-up and capture runs)."""

from __future__ import annotations

from typing import Any

_pool: Any = None


def set_token_to_kv_pool(pool: Any) -> None:
    global _pool
    _pool = pool


def get_token_to_kv_pool() -> Any:
    return _pool
