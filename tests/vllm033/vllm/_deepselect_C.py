"""Registers `torch.ops.deep_select.topk` / `get_alignment_requirement` with the schemas of vLLM 0.33's
`_deepselect_C.abi3.so`, backed by torch code with DeepSelect's contract (indices in [0, end), unsorted
order allowed, `idx_oob_fill_value` past a row's end)."""

import torch

TOPK = ("topk(Tensor input, int topk, Tensor? begin, Tensor? end, bool sorted_value, bool sorted_index, "
        "Tensor(a!)? output_value, Tensor(b!) output_index, Tensor? output_idx_offset, int idx_oob_fill_value, "
        "float value_oob_fill_value, bool return_value, bool abort_when_nan_found) -> ()")
ALIGN = "get_alignment_requirement() -> (int, int)"


def topk_kernel(input, topk, begin, end, sorted_value, sorted_index, output_value, output_index,
                output_idx_offset, idx_oob_fill_value, value_oob_fill_value, return_value, abort_when_nan_found):
    rows, width = input.shape
    cols = torch.arange(width, device=input.device)
    ends = torch.full((rows,), width, device=input.device) if end is None else end.long()
    valid = cols[None, :] < ends[:, None]
    k = min(topk, width)
    top = torch.where(valid, input.float(), float("-inf")).topk(k, dim=1).indices
    top = top.flip(1)  # DeepSelect does not promise an order
    picked = torch.where(valid.gather(1, top), top, idx_oob_fill_value)
    output_index[:rows, :k] = picked.to(output_index.dtype)
    output_index[:rows, k:topk] = idx_oob_fill_value


if not hasattr(torch.ops.deep_select, "topk"):  # once per process
    _lib = torch.library.Library("deep_select", "DEF")
    _lib.define(TOPK)
    _lib.define(ALIGN)
    for key in ("CPU", "CUDA"):
        _lib.impl("topk", topk_kernel, key)
    _lib.impl("get_alignment_requirement", lambda: (1024, 32), "CompositeExplicitAutograd")
    torch.ops.deep_select._logitreplay_test_lib = _lib
