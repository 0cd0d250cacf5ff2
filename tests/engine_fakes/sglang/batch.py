"""`sglang.srt.model_executor.forward_batch_info`: the forward modes the indexer branches on and the
fields of a forward batch it and the plugin read (the released module imports most of the server)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, auto
from typing import Any

import torch

from tests.engine_fakes.sglang.outside import outside_names


class ForwardMode(IntEnum):
    EXTEND = auto()
    DECODE = auto()
    MIXED = auto()
    IDLE = auto()
    TARGET_VERIFY = auto()
    DRAFT_EXTEND = auto()
    DRAFT_EXTEND_V2 = auto()
    SPLIT_PREFILL = auto()

    def is_extend(self, include_draft_extend_v2: bool = False) -> bool:
        extends = {ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.DRAFT_EXTEND, ForwardMode.TARGET_VERIFY,
                   ForwardMode.SPLIT_PREFILL}
        return self in extends or (include_draft_extend_v2 and self is ForwardMode.DRAFT_EXTEND_V2)

    def is_decode(self) -> bool:
        return self is ForwardMode.DECODE

    def is_idle(self) -> bool:
        return self is ForwardMode.IDLE

    def is_decode_or_idle(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.IDLE)

    def is_target_verify(self) -> bool:
        return self is ForwardMode.TARGET_VERIFY

    def is_draft_extend_v2(self) -> bool:
        return self is ForwardMode.DRAFT_EXTEND_V2

    def is_extend_without_speculative(self) -> bool:
        return self.is_extend() and not self.is_target_verify()

    def is_cuda_graph(self) -> bool:
        return self in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.IDLE)

    def is_cpu_graph(self) -> bool:
        return self is ForwardMode.DECODE


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    extend_seq_lens_cpu: list[int]
    attn_backend: Any
    # what the tests' attention layers feed the indexer for this batch: {"q_fp8", "weights"} per layer
    inputs: dict[str, Any]
    out_cache_loc: torch.Tensor
    moe_num_token_non_padded: Any = None
    attn_cp_metadata: Any = None


__getattr__ = outside_names(__name__)
