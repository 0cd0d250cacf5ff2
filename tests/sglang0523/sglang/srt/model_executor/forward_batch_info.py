"""`ForwardMode` and the `ForwardBatch` fields the DSA indexer reads (host lists beside device tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, auto
from typing import Any

import torch


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND = auto()
    DRAFT_EXTEND_V2 = auto()

    def is_decode(self) -> bool:
        return self == ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self == ForwardMode.IDLE

    def is_decode_or_idle(self) -> bool:
        return self == ForwardMode.DECODE or self == ForwardMode.IDLE

    def is_target_verify(self) -> bool:
        return self == ForwardMode.TARGET_VERIFY

    def is_draft_extend_v2(self) -> bool:
        return self == ForwardMode.DRAFT_EXTEND_V2

    def is_extend_without_speculative(self) -> bool:
        return self == ForwardMode.EXTEND or self == ForwardMode.MIXED


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor | None = None
    extend_seq_lens_cpu: list[int] | None = None
    attn_backend: Any = None  # the DSA backend: `get_indexer_metadata(layer_id, forward_batch)`
    extras: dict[str, Any] = field(default_factory=dict)
