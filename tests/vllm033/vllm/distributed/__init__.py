"""vllm.distributed: the TP rank and group. In the tests a forked rank sets `_TP_RANK`/`_TP_SIZE`; the group's
`all_gatherv` runs over torch.distributed (gloo) when it is initialized."""

import torch

_TP_RANK = 0
_TP_SIZE = 1


def get_tensor_model_parallel_rank() -> int:
    return _TP_RANK


def get_tensor_model_parallel_world_size() -> int:
    return _TP_SIZE


class _TpGroup:
    world_size = property(lambda self: _TP_SIZE)

    def all_gatherv(self, local: torch.Tensor, dim: int = 0, sizes: list[int] | None = None) -> torch.Tensor:
        assert dim == 0 and sizes is not None
        width = max(sizes)
        padded = local.new_full((width, *local.shape[1:]), -1)
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(parts, padded)
        return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)])


def get_tp_group() -> _TpGroup:
    return _TpGroup()
