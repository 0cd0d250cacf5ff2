from __future__ import annotations

import torch


def compute_cu_seqlens(seqlens: torch.Tensor) -> torch.Tensor:
    """Exclusive prefix sums with a leading 0 (int32)."""
    assert seqlens.dtype == torch.int32
    return torch.nn.functional.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
