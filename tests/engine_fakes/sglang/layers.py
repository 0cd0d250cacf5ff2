"""The layer bases SGLang's `Indexer` derives from or names (`sglang.kernels.fused_op`,
`sglang.srt.layers.layernorm`, `dsa_npu_indexer`): a fused op is a torch module here; the norms are never built (the tests
give the indexer its projections' outputs directly)."""

from __future__ import annotations

import torch

from tests.engine_fakes.sglang.outside import outside_names


class BaseFusedOp(torch.nn.Module):
    """A module whose forward SGLang dispatches per platform; the tests call the indexer's methods."""


class DSANPUIndexerMixin:
    """The indexer's Ascend NPU methods (`dsa_npu_indexer`): none runs on this host."""


__getattr__ = outside_names(__name__)
