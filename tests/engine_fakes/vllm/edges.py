"""The edges of vLLM's indexer code, as CPU fakes: what the released modules call at the kernel
boundary (logits, the K-cache gather, the top-k ops, DeepSelect, the fused MQA top-k), the forward
context, the platform, the switches and the collectives. Written from the facts of their names,
signatures and semantics; `Edges` holds what a test sets (the logits path, the TP rank).

The key cache layout is this fake's own: `kv_cache[block, slot]` holds one key's HEAD_DIM values and its
scale in the last column; `cp_gather_indexer_k_quant_cache` copies a chunk's keys into the workspace
(values, and the fp32 scale in the first 4 bytes of each 4-byte scale row), in request order.
"""

from __future__ import annotations

import enum
import functools
import logging
import types
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.engine_fakes.vllm.loader import InertModule

HEAD_DIM = 32
GARBAGE = 7.5e3  # what the fake logits kernel leaves past each row's end (DeepGEMM leaves memory as is)


@dataclass
class Edges:
    """What the tests choose at the edges."""

    fused: bool = False  # use_fused_mqa_topk: the layer may take the fused MQA top-k
    fused_chunks: bool = True  # fused_mqa_topk_chunk: a planned chunk takes it (else dense sub-windows)
    logits_mb: int = 64  # VLLM_SPARSE_INDEXER_MAX_LOGITS_MB
    tp_rank: int = 0
    tp_size: int = 1
    gathers: list[Any] = field(default_factory=list)  # all_gatherv calls: (local rows, sizes)


def kernel(body: Callable[..., Any]) -> Callable[..., Any]:
    """A device kernel's CPU model: it reads its inputs on the host, which a GPU kernel never makes the
    host do, so the tests' watch for host syncs (a torch function mode) is off inside it."""

    @functools.wraps(body)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._C.DisableTorchFunction():
            return body(*args, **kwargs)

    return run


def score(q: torch.Tensor, keys: torch.Tensor, scales: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The indexer's score of query rows against keys: sum over heads of weight * relu(q . k), times the
    key's scale. (rows, heads, dim) x (keys, dim) -> (rows, keys), fp32."""
    dots = torch.einsum("rhd,kd->rhk", q.float(), keys.float()).clamp(min=0)
    return (dots * weights.float()[:, :, None]).sum(1) * scales.float()[None, :]


def _stride(width: int, dtype: torch.dtype) -> int:
    """DeepGEMM pads the logits' row stride; DeepSelect wants it 1024-byte aligned."""
    unit = 1024 // torch.empty((), dtype=dtype).element_size()
    return max(unit, -(-width // unit) * unit)


@kernel
def mqa_logits(qs: tuple[torch.Tensor, Any], ks_: tuple[torch.Tensor, torch.Tensor], weights: torch.Tensor,
               cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, max_seqlen_k: int,
               logits_dtype: torch.dtype = torch.float32, **_: Any) -> torch.Tensor:
    """`fp8_fp4_mqa_logits`: compressed logits, row i's keys [ks[i], ke[i]) of the gathered K from column
    0, `max_seqlen_k` columns, a padded stride, garbage past each row's end."""
    q, keys, scales = qs[0], ks_[0], ks_[1]
    rows = q.shape[0]
    out = torch.full((rows, _stride(max_seqlen_k, logits_dtype)), GARBAGE, dtype=logits_dtype)[:, :max_seqlen_k]
    for i in range(rows):
        a, b = int(cu_seqlen_ks[i]), int(cu_seqlen_ke[i])
        out[i, :b - a] = score(q[i:i + 1], keys[a:b], scales[a:b], weights[i:i + 1])[0].to(logits_dtype)
    return out


def decode_ends(seq_lens: torch.Tensor, next_n: int) -> list[int]:
    """Each decode row's context length: (B, next_n) per-row lengths as given, or (B, 1) lengths L whose
    row j of next_n sees L - next_n + 1 + j keys."""
    if seq_lens.numel() == seq_lens.shape[0] * next_n:
        return [int(v) for v in seq_lens.reshape(-1)]
    return [max(0, int(length) - next_n + 1 + j) for length in seq_lens.reshape(-1) for j in range(next_n)]


@kernel
def paged_logits(qs: tuple[torch.Tensor, Any], kv_cache: torch.Tensor, weights: torch.Tensor,
                 seq_lens: torch.Tensor, block_table: torch.Tensor, schedule: Any, max_model_len: int,
                 logits_dtype: torch.dtype = torch.float32, **_: Any) -> torch.Tensor:
    """`fp8_fp4_paged_mqa_logits`: (batch * next_n, max_model_len) logits of the decode rows against their
    request's keys in the paged cache (`kv_cache`: the (blocks, block, 1, width) view), from column 0,
    garbage past each row's length."""
    q = qs[0]
    batch, next_n = q.shape[:2]
    block = kv_cache.shape[1]
    out = torch.full((batch * next_n, _stride(max_model_len, logits_dtype)), GARBAGE,
                     dtype=logits_dtype)[:, :max_model_len]
    for r, end in enumerate(decode_ends(seq_lens, next_n)):
        b = r // next_n
        slots = torch.stack([kv_cache[int(block_table[b, t // block]), t % block, 0] for t in range(end)])
        out[r, :end] = score(q[b, r % next_n][None], slots[:, :HEAD_DIM], slots[:, HEAD_DIM],
                             weights[r:r + 1])[0].to(logits_dtype)
    return out


@kernel
def gather_keys(kv_cache: torch.Tensor, k_quant: torch.Tensor, k_scale: torch.Tensor, block_table: torch.Tensor,
                cu_seq_lens: torch.Tensor) -> None:
    """`cp_gather_indexer_k_quant_cache`: request b's keys, block by block of its row of the block table,
    into rows [cu_seq_lens[b], cu_seq_lens[b + 1]) of the workspace."""
    block = kv_cache.shape[1]
    scales = k_scale.view(torch.float32)
    for b in range(block_table.shape[0]):
        start, end = int(cu_seq_lens[b]), int(cu_seq_lens[b + 1])
        for t in range(end - start):
            slot = kv_cache[int(block_table[b, t // block]), t % block]
            k_quant[start + t] = slot[:HEAD_DIM].to(k_quant.dtype)
            scales[start + t, 0] = slot[HEAD_DIM]


def _select(row: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k columns of one row's valid prefix, -1 past its length (any order: tests compare sets)."""
    n = min(k, row.numel())
    picked = torch.topk(row.float(), n).indices.to(torch.int32) if n else torch.empty(0, dtype=torch.int32)
    return torch.cat([picked, torch.full((k - n,), -1, dtype=torch.int32)])


@kernel
def top_k_per_row_prefill(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                          indices: torch.Tensor, num_rows: int, stride0: int, stride1: int, k: int) -> None:
    """The prefill top-k op: row i's top k of columns [start, end), as offsets from start."""
    for i in range(num_rows):
        a, b = int(row_starts[i]), int(row_ends[i])
        indices[i, :k] = _select(logits[i, a:b], k)


@kernel
def top_k_per_row_decode(logits: torch.Tensor, next_n: int, seq_lens: torch.Tensor, indices: torch.Tensor,
                         num_rows: int, stride0: int, stride1: int, k: int) -> None:
    """The decode top-k op: row i's top k of its first `decode_ends` columns."""
    for i, end in enumerate(decode_ends(seq_lens, next_n)[:num_rows]):
        indices[i, :k] = _select(logits[i, :end], k)


@kernel
def deep_select(input: torch.Tensor, k: int, begin: Any, end: torch.Tensor | None, sorted_value: bool,
                sorted_index: bool, output_value: Any, output_idx: torch.Tensor, output_idx_offset: Any,
                idx_fill: int, value_fill: float, return_value: bool, abort_on_nan: bool) -> None:
    """`torch.ops.deep_select.topk` as `deep_select_topk` calls it: each row's top k of [0, end)."""
    for i in range(input.shape[0]):
        stop = input.shape[1] if end is None else int(end[i])
        output_idx[i, :k] = _select(input[i, :stop], k)


@kernel
def fused_topk(q: torch.Tensor, k_quant: torch.Tensor, key_scales: torch.Tensor, weights: torch.Tensor,
               cu_seqlen_ks: torch.Tensor, cu_seqlen_ke: torch.Tensor, out: torch.Tensor) -> None:
    """`fused_mqa_topk_prefill`: scores and selects row by row, no logits matrix."""
    for i in range(q.shape[0]):
        a, b = int(cu_seqlen_ks[i]), int(cu_seqlen_ke[i])
        out[i] = _select(score(q[i:i + 1], k_quant[a:b], key_scales[a:b], weights[i:i + 1])[0], out.shape[1])


def candidates_module(name: str) -> types.ModuleType:
    """`kernels/attention/dsa/candidate_blocks.py` (DeepSeek V4.1's two-level selection), its kernels as CPU
    models: the candidate source keeps each row's `topk_blocks` best blocks of `block_size` columns (a
    block scores its best column) through DeepSelect; a consumer sets its logits to -inf outside them."""
    from vllm.model_executor.layers.indexer_topk import deep_select_topk

    @kernel
    def block_scores(logits: torch.Tensor, row_ks: torch.Tensor | None, row_ke: torch.Tensor,
                     block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows, cols = logits.shape
        blocks = -(-cols // block_size)
        scores = torch.full((rows, _stride(blocks, torch.float32)), float("-inf"))[:, :blocks]
        valid = torch.zeros(rows, dtype=torch.int32)
        for r in range(rows):
            a = 0 if row_ks is None else int(row_ks[r])
            b = int(row_ke[r])
            n = -(-(b - a) // block_size)
            valid[r] = n
            for j in range(n):
                scores[r, j] = logits[r, a + j * block_size:min(b, a + (j + 1) * block_size)].float().max()
        return scores, valid

    def select_candidate_blocks(logits: torch.Tensor, row_ks: torch.Tensor | None, row_ke: torch.Tensor,
                                topk_blocks: int, block_size: int, out: torch.Tensor, row_repeat: int = 1,
                                score_dtype: Any = None) -> None:
        scores, valid = block_scores(logits, row_ks, row_ke, block_size)
        deep_select_topk(scores, topk_blocks, end=valid, output_idx=out)

    @kernel
    def apply_candidate_mask(logits: torch.Tensor, row_starts: torch.Tensor | None, row_ends: torch.Tensor,
                             candidates: torch.Tensor, block_size: int, row_repeat: int = 1) -> None:
        for r in range(logits.shape[0]):
            a = 0 if row_starts is None else int(row_starts[r])
            keep = torch.zeros(logits.shape[1], dtype=torch.bool)
            for block in candidates[r].tolist():
                if block >= 0:
                    keep[a + block * block_size:a + (block + 1) * block_size] = True
            logits[r, :int(row_ends[r])][~keep[:int(row_ends[r])]] = float("-inf")

    return _module(name, {"select_candidate_blocks": select_candidate_blocks,
                          "apply_candidate_mask": apply_candidate_mask})


class _Workspace:
    def get_simultaneous(self, *specs: tuple[tuple[int, ...], torch.dtype]) -> list[torch.Tensor]:
        return [torch.zeros(shape, dtype=dtype) for shape, dtype in specs]


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass
class ForwardContext:
    attn_metadata: Any
    cudagraph_runtime_mode: CUDAGraphMode = CUDAGraphMode.NONE


_context: list[ForwardContext] = []


def get_forward_context() -> ForwardContext:
    assert _context, "no forward context"
    return _context[-1]


@contextmanager
def set_forward_context(attn_metadata: Any) -> Any:
    _context.append(ForwardContext(attn_metadata))
    try:
        yield
    finally:
        _context.pop()


class _Platform:
    dispatch_key = "CPU"

    def fp8_dtype(self) -> torch.dtype:
        return torch.float32  # the fake cache holds fp32 keys

    def is_device_capability_family(self, family: int) -> bool:
        return False

    def __getattr__(self, name: str) -> Callable[[], bool]:
        if name.startswith("is_"):
            return lambda: False
        raise AttributeError(name)


class CudaPlatform(_Platform):
    """A CUDA platform of the device `family` (90: Hopper, 100: Blackwell), for code that runs on CUDA
    tensors or builds only on CUDA."""

    dispatch_key = "CUDA"

    def __init__(self, family: int = 90) -> None:
        self.family = family

    def is_cuda(self) -> bool:
        return True

    def is_device_capability_family(self, family: int) -> bool:
        return family == self.family

    def has_device_capability(self, capability: int) -> bool:
        return self.family >= capability


def _module(name: str, names: dict[str, Any], inert: bool = False) -> types.ModuleType:
    module = InertModule(name) if inert else types.ModuleType(name)
    module.__dict__.update(names)
    return module


def fakes(edges: Edges) -> dict[str, Callable[[str], types.ModuleType]]:
    """Module name -> builder, for `loader.load`."""

    def deepselect_c(name: str) -> types.ModuleType:
        namespace = torch.ops.deep_select
        namespace.topk = deep_select
        namespace.get_alignment_requirement = lambda: (1024, 32)
        return _module(name, {})

    class Group:
        def all_gatherv(self, local: torch.Tensor, dim: int = 0, sizes: list[int] | None = None) -> torch.Tensor:
            """The TP all-gather of each rank's rows: with torch.distributed (gloo) initialised, the real
            collective; in one process, this rank's rows in their place and -1 elsewhere."""
            sizes = sizes or [local.shape[0]] * edges.tp_size
            edges.gathers.append((local.clone(), list(sizes)))
            if torch.distributed.is_initialized():
                parts = [torch.empty((n, *local.shape[1:]), dtype=local.dtype) for n in sizes]
                torch.distributed.all_gather(parts, local) if len(set(sizes)) == 1 else _gatherv(parts, local)
                return torch.cat(parts)
            out = torch.full((sum(sizes), *local.shape[1:]), -1, dtype=local.dtype)
            start = sum(sizes[:edges.tp_rank])
            out[start:start + local.shape[0]] = local
            return out

    def _gatherv(parts: list[torch.Tensor], local: torch.Tensor) -> None:
        width = max(p.shape[0] for p in parts)
        padded = [torch.empty((width, *local.shape[1:]), dtype=local.dtype) for _ in parts]
        mine = torch.full((width, *local.shape[1:]), -1, dtype=local.dtype)
        mine[:local.shape[0]] = local
        torch.distributed.all_gather(padded, mine)
        for p, q in zip(parts, padded, strict=True):
            p.copy_(q[:p.shape[0]])

    group = Group()
    return {
        "vllm.envs": lambda n: _module(n, {
            "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": edges.logits_mb, "VLLM_SPARSE_INDEXER_MAX_DECODE_LOGITS_MB": 0,
            "VLLM_USE_FUSED_MQA_TOPK": edges.fused, "VLLM_BATCH_INVARIANT": False,
            "VLLM_USE_DIRECT_DCP_A2A": False}),
        "vllm.platforms": lambda n: _module(n, {"current_platform": _Platform()}, inert=True),
        "vllm.forward_context": lambda n: _module(n, {
            "ForwardContext": ForwardContext, "get_forward_context": get_forward_context,
            "set_forward_context": set_forward_context}),
        "vllm.config": lambda n: _module(n, {
            "CUDAGraphMode": CUDAGraphMode, "get_current_vllm_config_or_none": lambda: None}, inert=True),
        "vllm.logger": lambda n: _module(n, {"init_logger": logging.getLogger}),
        "vllm.utils.torch_utils": lambda n: _module(n, {
            "_resolve_layer_name": lambda v: v, "_encode_layer_name": lambda v: v, "LayerNameType": str,
            "direct_register_custom_op": lambda *a, **k: None, "STR_DTYPE_TO_TORCH_DTYPE": {},
            "PIN_MEMORY": False}, inert=True),
        "vllm.compilation.breakable_cudagraph": lambda n: _module(n, {"eager_break_during_capture": lambda f: f}),
        "vllm._custom_ops": lambda n: _module(n, {
            "top_k_per_row_prefill": top_k_per_row_prefill, "top_k_per_row_decode": top_k_per_row_decode,
            "cp_gather_indexer_k_quant_cache": gather_keys}),
        "vllm._deepselect_C": deepselect_c,
        "vllm.utils.deep_gemm": lambda n: _module(n, {
            "fp8_fp4_mqa_logits": mqa_logits, "fp8_fp4_paged_mqa_logits": paged_logits,
            "has_deep_gemm": lambda: True,
            "mqa_logits_use_mx_scales": lambda: False,
            "mqa_logits_mx_inputs": lambda q, q_scale, weights, dtype=None: (q_scale, weights)}, inert=True),
        "vllm.model_executor.kernels.attention.dsa.fused_mqa_topk": lambda n: _module(n, {
            "use_fused_mqa_topk": lambda **kw: edges.fused,
            "fused_mqa_topk_chunk": lambda *a: edges.fused_chunks, "fused_mqa_topk_prefill": fused_topk,
            "fused_mqa_topk_key_scales": lambda k_scale: k_scale.view(torch.float32).squeeze(-1),
            "get_fused_mqa_topk_workspaces": lambda *a: [], "FUSED_MQA_TOPK_MAX_KEYS": 1 << 20,
            "FUSED_MQA_TOPK_MAX_ROWS": 1 << 20}),
        "vllm.model_executor.kernels.attention.dsa.candidate_blocks": candidates_module,
        "vllm.v1.worker.workspace": lambda n: _module(n, {"current_workspace_manager": _Workspace}),
        "vllm.distributed": lambda n: _module(n, {
            "get_tensor_model_parallel_rank": lambda: edges.tp_rank,
            "get_tensor_model_parallel_world_size": lambda: edges.tp_size, "get_tp_group": lambda: group},
            inert=True),
    }
