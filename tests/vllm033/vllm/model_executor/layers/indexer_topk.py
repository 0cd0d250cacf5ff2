"""vllm/model_executor/layers/indexer_topk.py l.24-128: the DeepSelect wrapper, verbatim in substance."""

import functools

import torch

IDX_OOB_FILL_VALUE = -1

try:
    import vllm._deepselect_C  # noqa: F401  (registers torch.ops.deep_select)

    _HAS_DEEP_SELECT_C = True
except ImportError:
    _HAS_DEEP_SELECT_C = False


@functools.lru_cache(maxsize=1)
def get_deep_select_stride_requirement() -> tuple[int, int]:
    return torch.ops.deep_select.get_alignment_requirement()


def _get_empty_and_aligned_tensor(dim0, dim1, device, dtype):
    req = get_deep_select_stride_requirement()[1] // dtype.itemsize
    return torch.empty((dim0, -(-dim1 // req) * req), device=device, dtype=dtype)[:, :dim1]


def deep_select_topk(
    input: torch.Tensor,
    topk: int,
    end: torch.Tensor | None = None,
    output_idx: torch.Tensor | None = None,
    indices_dtype: torch.dtype = torch.int32,
) -> torch.Tensor:
    assert input.dim() == 2 and input.stride(1) == 1
    assert input.stride(0) * input.element_size() % get_deep_select_stride_requirement()[0] == 0
    num_rows = input.shape[0]
    if output_idx is None:
        output_idx = _get_empty_and_aligned_tensor(num_rows, topk, input.device, indices_dtype)
    else:
        assert output_idx.dtype == indices_dtype
        assert output_idx.shape[0] >= num_rows and output_idx.shape[1] >= topk
    torch.ops.deep_select.topk(input, topk, None, end, False, False, None, output_idx, None,
                               IDX_OOB_FILL_VALUE, float("-inf"), False, False)
    return output_idx
