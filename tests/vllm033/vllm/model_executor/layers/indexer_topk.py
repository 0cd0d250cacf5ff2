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


# ---------------------------------------------------------------------------
# The decode top-k (l.15-21, l.136-405): backend resolution and the calls, as in 0.33; the workspace is
# allocated here (vLLM takes it from `current_workspace_manager()`), flashinfer and aiter are left out.
# ---------------------------------------------------------------------------

from vllm import _custom_ops as ops  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

RADIX_TOPK_WORKSPACE_SIZE = 1024 * 1024
AUTO_COOPERATIVE_MAX_ROWS = 64


@functools.cache
def get_indexer_topk(backend: str) -> "SparseIndexerTopk":
    return SparseIndexerTopk(backend)


class SparseIndexerTopk(torch.nn.Module):
    def __init__(self, backend: str | None = None) -> None:
        super().__init__()
        self._backend = backend or "auto"
        self._is_cuda = current_platform.is_cuda()
        self._has_deep_select = self._is_cuda and current_platform.is_device_capability_family(100)
        self._cooperative_capable = self._is_cuda and (
            current_platform.has_device_capability(90)
            and not current_platform.is_device_capability_family(120)
        )

    def resolve_backend(self, logits: torch.Tensor, topk_tokens: int, num_rows: int) -> str:
        if self._backend == "auto":
            if not self._cooperative_constraints(logits, topk_tokens, num_rows):
                return "cooperative"
            if self._is_cuda and topk_tokens in (512, 1024, 2048):
                return "persistent"
            return "per_row"
        return self._backend

    def _cooperative_constraints(self, logits, topk_tokens, num_rows) -> list[str]:
        failures = []
        if not self._is_cuda:
            failures.append("requires a CUDA platform")
        if topk_tokens not in (512, 1024, 2048):
            failures.append(f"topk_tokens must be in (512, 1024, 2048), got {topk_tokens}")
        if num_rows > AUTO_COOPERATIVE_MAX_ROWS:
            failures.append(f"num_rows must be <= {AUTO_COOPERATIVE_MAX_ROWS}, got {num_rows}")
        if logits.stride(0) % 4 != 0:
            failures.append(f"logits.stride(0) must be divisible by 4, got {logits.stride(0)}")
        if self._is_cuda and not self._cooperative_capable:
            failures.append("requires SM90+ and is not supported on the SM12x family")
        return failures

    @staticmethod
    def _row_ends(seq_lens: torch.Tensor, next_n: int, num_rows: int) -> torch.Tensor:
        if seq_lens.numel() == num_rows:
            row_ends = seq_lens.reshape(-1)
        else:
            next_n_offsets = torch.arange(next_n, dtype=torch.int32, device=seq_lens.device)
            row_ends = (seq_lens.reshape(-1, 1) - next_n + 1 + next_n_offsets).clamp_(min=0).reshape(-1)
        assert row_ends.dtype == torch.int32
        return row_ends

    def forward(self, logits: torch.Tensor, seq_lens: torch.Tensor, next_n: int, topk_indices: torch.Tensor,
                topk_tokens: int, max_seq_len: int) -> None:
        backend = self.resolve_backend(logits, topk_tokens, logits.shape[0])
        if backend == "deep_select":
            row_ends = self._row_ends(seq_lens, next_n, logits.shape[0])
            deep_select_topk(logits, topk_tokens, end=row_ends, output_idx=topk_indices)
        elif backend in ("cooperative", "persistent"):
            topk_workspace = torch.empty(RADIX_TOPK_WORKSPACE_SIZE, dtype=torch.uint8, device=logits.device)
            op = torch.ops._C.cooperative_topk if backend == "cooperative" else torch.ops._C.persistent_topk
            op(logits, seq_lens, topk_indices, topk_workspace, topk_tokens, max_seq_len)
        elif backend == "torch":
            row_ends = self._row_ends(seq_lens, next_n, logits.shape[0])
            cols = torch.arange(logits.shape[1], device=logits.device)
            masked = logits.masked_fill(cols.unsqueeze(0) >= row_ends.unsqueeze(1), float("-inf"))
            indices = masked.topk(topk_tokens, dim=-1).indices
            in_range = torch.arange(topk_tokens, device=logits.device).unsqueeze(0) < row_ends.unsqueeze(1)
            indices = torch.where(in_range, indices, -1)
            topk_indices.copy_(indices)
        else:
            assert backend == "per_row", f"unknown topk backend: {backend}"
            self._per_row(logits, seq_lens, next_n, topk_indices, topk_tokens)

    @staticmethod
    def _per_row(logits, seq_lens, next_n, topk_indices, topk_tokens) -> None:
        ops.top_k_per_row_decode(logits, next_n, seq_lens, topk_indices, logits.shape[0], logits.stride(0),
                                 logits.stride(1), topk_tokens)
