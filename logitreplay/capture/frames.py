"""What every serving plugin reads from the calling frames: the layer that called, found by walking up
from an intercepted call, and the host ints and strings of the callers' locals.

Engine-specific readers (`vllm_frames`, `sglang_sites`) say which frames and locals carry which fact; they
only read Python objects and host ints: no device data, no sync.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import FrameType
from typing import Any

from logitreplay.capture.hooks import layer_number

# How far up from an op's wrapper the frames are searched: the indexer function is one or two frames
# up; the owning layer is above torch's op dispatch, the custom-op dispatch and nn.Module's call.
DEPTH = 48


@dataclass
class Layer:
    """The layer that called, as the case records it."""

    name: str
    index: int
    named_from: str  # "indexer module" or "k_cache_prefix" (no owning module found)
    compress_ratio: int | None = None
    k_cache_prefix: str | None = None
    candidate_source_layer: int | None = None

    def attrs(self) -> dict[str, Any]:
        key_layer = layer_number(self.k_cache_prefix) if self.k_cache_prefix else None
        return {"layer_name": self.name, "layer_index": self.index, "layer_named_from": self.named_from,
                "compress_ratio": self.compress_ratio, "k_cache_prefix": self.k_cache_prefix,
                "k_cache_layer_index": key_layer}


def find_frame(frame: FrameType | None, *, function: str | None = None, local: str | None = None,
               depth: int = DEPTH) -> FrameType | None:
    """The nearest frame (this one or above) running `function` and/or holding the local `local`."""
    for _ in range(depth):
        if frame is None:
            return None
        if ((function is None or frame.f_code.co_name == function)
                and (local is None or local in frame.f_locals)):
            return frame
        frame = frame.f_back
    return None


def host_int(v: Any) -> int | None:
    """`v` when it is a host int (not a bool, not a tensor), else None."""
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def host_str(v: Any) -> str | None:
    return None if v is None else str(v)


__all__ = ["DEPTH", "Layer", "find_frame", "host_int", "host_str"]
