"""Process-global capture-mode flag: True while a runner warms up and captures its CUDA graphs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

is_capture_mode = False


def get_is_capture_mode() -> bool:
    return is_capture_mode


@contextmanager
def model_capture_mode() -> Iterator[None]:
    global is_capture_mode
    is_capture_mode = True
    try:
        yield
    finally:
        is_capture_mode = False
