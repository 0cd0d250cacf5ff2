"""vLLM 0.33's own top-k kernels as selectors, called exactly as vLLM calls them.

Prefill: `vllm-native` (`torch.ops._C.top_k_per_row_prefill`, `sparse_attn_indexer.py`). Decode, the
backends of `SparseIndexerTopk` (`model_executor/layers/indexer_topk.py`): `vllm-decode`
(`top_k_per_row_decode`, the `per_row` fallback), `vllm-persistent` (`persistent_topk`),
`vllm-cooperative` (`cooperative_topk`), both with the 1 MiB uint8 workspace vLLM's workspace manager hands
them (allocated once in `prepare`), and `vllm-deepselect` (`torch.ops.deep_select.topk` as
`deep_select_topk` calls it; fp32 or bf16, the decode form keeps bf16 logits). `vllm-auto` applies vLLM
0.33's choice per case: the prefill op for a prefill case, and for a decode case the `auto` chain
(cooperative for <= 64 rows, else persistent, for top_k 512/1024/2048; else per_row), and says which.

The libraries are found as vLLM loads them, or from a path (`vllm-native@/path/_C_stable_libtorch.abi3.so`):
see vllm_libs.py. vLLM's kernels write a contiguous (rows, top_k) block (no output stride), so an adapter
stages into one and copies into the strided view as part of the timed launch; `staging_bytes` and `note`
report that buffer. Decode kernels get the row ends as per-row `seq_lens` of shape (batch, next_n), a view
of the very bounds tensor the replay rewrites for check 5, and a host `max_seq_len` bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from logitreplay.archive import ELEMENT_BYTES, Case
from logitreplay.selectors.base import Launch
from logitreplay.selectors.upstream import Upstream, fp32_only, staged, starts_at_zero
from logitreplay.selectors.vllm_libs import C_OPS, DEEPSELECT, KernelLibrary, Loaded, load

RADIX_TOPK_WORKSPACE_SIZE = 1024 * 1024  # indexer_topk.py: the cooperative/persistent workspace, uint8
FAST_TOP_K = (512, 1024, 2048)  # the top_k persistent_topk and cooperative_topk are built for
AUTO_COOPERATIVE_MAX_ROWS = 64  # indexer_topk.py
DEEPSELECT_MAX_K = 4096  # is_deep_select_supported
DEEPSELECT_MAX_COLS = 1 << 23


@dataclass(frozen=True)
class DecodeCall:
    """The decode arguments a case stands for: `batch` x `next_n` rows and the host `max_seq_len`."""

    batch: int
    next_n: int
    max_seq_len: int


def decode_call(case: Case) -> DecodeCall:
    """The case's decode facts when it records them (`kind: decode`), else one request per row and the
    longest row as `max_seq_len`; vLLM's `max_seq_len` is a loose bound, never below a row's end."""
    longest = int(case.row_ends.max()) if case.rows else 0
    facts = getattr(case, "decode", None)
    if facts is not None and int(facts.batch) * int(facts.next_n) == case.rows:
        return DecodeCall(int(facts.batch), int(facts.next_n), max(int(facts.max_seq_len), longest))
    return DecodeCall(case.rows, 1, longest)


def _starts_at_zero(case: Case) -> str | None:
    return starts_at_zero(case, "decode kernels take row lengths only")


class VllmKernel(Upstream):
    """A kernel of one of vLLM's libraries; subclasses give the library, limits and the launch."""

    op: str = ""  # the op's name in the library's namespace
    library: KernelLibrary = C_OPS

    @property
    def label(self) -> str:  # type: ignore[override]
        return self.library.label

    def find(self) -> Loaded | str:
        return load(self.library, self.path)

    def kernel_name(self, case: Case) -> str:
        return self.op

    def _op(self) -> Callable[..., None]:
        loaded = self.find()
        if isinstance(loaded, str):
            raise RuntimeError(loaded)
        return getattr(getattr(torch.ops, self.library.namespace), self.op)


def _call(case: Case | None, logits: torch.Tensor) -> DecodeCall:
    """The case's decode call, or one request per row bounded by the width when no case is given."""
    return decode_call(case) if case is not None else DecodeCall(logits.shape[0], 1, logits.shape[1])


class VllmPrefill(VllmKernel):
    """`top_k_per_row_prefill` (sparse_attn_indexer.py l.763): float32, rows with start and end, indices
    relative to the start, -1 tails, rows written `topK` apart."""

    name = "vllm-native"
    op = "top_k_per_row_prefill"

    def limits(self, case: Case, device: torch.device) -> str | None:
        return fp32_only(case)

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        op, rows = self._op(), logits.shape[0]
        stride0, stride1 = logits.stride()
        return staged(lambda idx: op(logits, row_starts, row_ends, idx, rows, stride0, stride1, top_k), out)


class VllmDecode(VllmKernel):
    """`top_k_per_row_decode` (indexer_topk.py l.396, the `per_row` backend): float32, any top_k."""

    name = "vllm-decode"
    op = "top_k_per_row_decode"

    def limits(self, case: Case, device: torch.device) -> str | None:
        return fp32_only(case) or _starts_at_zero(case)

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        op, call, rows = self._op(), _call(case, logits), logits.shape[0]
        seq_lens = row_ends.view(call.batch, call.next_n)
        stride0, stride1 = logits.stride()
        return staged(lambda idx: op(logits, call.next_n, seq_lens, idx, rows, stride0, stride1, top_k), out)


class VllmPersistent(VllmKernel):
    """`persistent_topk` (indexer_topk.py l.330): float32, top_k 512/1024/2048, a 1 MiB workspace;
    `max_seq_len` bounds every row and gates its sampled path."""

    name = "vllm-persistent"
    op = "persistent_topk"

    def limits(self, case: Case, device: torch.device) -> str | None:
        if case.top_k not in FAST_TOP_K:
            return f"top_k {case.top_k}: built for top_k in {FAST_TOP_K} only"
        return fp32_only(case) or _starts_at_zero(case)

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        op, call = self._op(), _call(case, logits)
        seq_lens = row_ends.view(call.batch, call.next_n)
        workspace = torch.zeros(RADIX_TOPK_WORKSPACE_SIZE, dtype=torch.uint8, device=logits.device)
        return staged(lambda idx: op(logits, seq_lens, idx, workspace, top_k, call.max_seq_len), out)


class VllmCooperative(VllmPersistent):
    """`cooperative_topk` (indexer_topk.py l.318): persistent's limits, plus at most 64 rows, a row stride
    that is a multiple of 4 elements (TMA), and SM 9.0 or newer but not the SM 12.x family."""

    name = "vllm-cooperative"
    op = "cooperative_topk"

    def limits(self, case: Case, device: torch.device) -> str | None:
        return cooperative_constraints(case, device) or super().limits(case, device)


def cooperative_constraints(case: Case, device: torch.device) -> str | None:
    """`_cooperative_constraints` of indexer_topk.py (l.255), beyond the top_k set."""
    major, _ = torch.cuda.get_device_capability(device)
    if major < 9 or major == 12:
        return f"cooperative_topk needs SM 9.0 or newer, not SM 12.x (this GPU is SM {major}.x)"
    if case.rows > AUTO_COOPERATIVE_MAX_ROWS:
        return f"{case.rows} rows: cooperative_topk takes at most {AUTO_COOPERATIVE_MAX_ROWS}"
    if case.row_stride % 4:
        return f"row stride {case.row_stride} is not a multiple of 4 elements (TMA alignment)"
    return None


class VllmDeepSelect(VllmKernel):
    """`deep_select_topk` (indexer_topk.py l.92): `torch.ops.deep_select.topk(input, topk, None, end,
    False, False, None, output_idx, None, -1, -inf, False, False)`; float32 or bfloat16, top_k <= 4096,
    row ends only, the input row stride aligned as `get_alignment_requirement()` says. The output view is
    passed as it is when it meets the output alignment, as vLLM passes its index buffer; else staged."""

    name = "vllm-deepselect"
    library = DEEPSELECT
    op = "topk"

    def _alignment(self) -> tuple[int, int]:
        req = torch.ops.deep_select.get_alignment_requirement()
        return int(req[0]), int(req[1])

    def limits(self, case: Case, device: torch.device) -> str | None:
        if case.top_k > DEEPSELECT_MAX_K:
            return f"top_k {case.top_k} > {DEEPSELECT_MAX_K}"
        if case.cols >= DEEPSELECT_MAX_COLS:
            return f"{case.cols} columns: DeepSelect takes fewer than {DEEPSELECT_MAX_COLS}"
        align = self._alignment()[0]
        if (case.row_stride * ELEMENT_BYTES[case.dtype]) % align:
            return f"input row stride {case.row_stride} is not {align}-byte aligned (DeepSelect requirement)"
        return _starts_at_zero(case)

    _direct: bool | None = None  # whether the last prepare wrote into the view itself

    def staging_bytes(self, case: Case) -> int:
        return 0 if self._direct is True else super().staging_bytes(case)

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        op = self._op()
        out_align = self._alignment()[1]

        def kernel(idx: torch.Tensor) -> None:
            op(logits, top_k, None, row_ends, False, False, None, idx, None, -1, float("-inf"), False, False)

        self._direct = (out.stride(1) == 1 and (out.stride(0) * 4) % out_align == 0
                        and out.data_ptr() % out_align == 0)
        if self._direct:
            return lambda: kernel(out)
        width = -(-top_k // (out_align // 4)) * (out_align // 4)
        scratch = torch.empty((logits.shape[0], width), dtype=torch.int32, device=logits.device)[:, :top_k]

        def launch() -> None:
            kernel(scratch)
            out.copy_(scratch)

        return launch


class VllmAuto(VllmKernel):
    """What vLLM 0.33 runs for each case: `top_k_per_row_prefill` for a prefill case; for a decode case
    `SparseIndexerTopk`'s `auto` resolution (`_resolve_auto`, l.236): cooperative when its constraints
    hold, else persistent for top_k 512/1024/2048, else per_row. The choice is made from the case each
    time it is needed (supports, note, prepare), never remembered."""

    name = "vllm-auto"

    def __init__(self, library_path: str | None = None) -> None:
        super().__init__(library_path)
        self._backends: dict[str, VllmKernel] = {
            cls.name: cls(library_path) for cls in (VllmPrefill, VllmCooperative, VllmPersistent, VllmDecode)}

    def chosen(self, case: Case | None, device: torch.device) -> VllmKernel:
        if case is None or getattr(case, "kind", "prefill") != "decode":
            return self._backends["vllm-native"]
        if case.top_k in FAST_TOP_K and device.type == "cuda":
            if cooperative_constraints(case, device) is None:
                return self._backends["vllm-cooperative"]
            return self._backends["vllm-persistent"]
        return self._backends["vllm-decode"]

    def supports(self, case: Case, device: torch.device) -> str | None:
        why = super().supports(case, device)
        if why is not None:
            return why
        backend = self.chosen(case, device)
        why = backend.supports(case, device)
        return None if why is None else f"vLLM runs {backend.op} here, which cannot: {why}"

    def kernel_name(self, case: Case) -> str:
        return f"vLLM 0.33 chose {self.chosen(case, torch.device('cuda')).op}"

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        return self.chosen(case, logits.device).prepare_case(case, logits, row_starts, row_ends, top_k, out)


VLLM: dict[str, str] = {
    "vllm-native": "logitreplay.selectors.vllm:VllmPrefill",
    "vllm-decode": "logitreplay.selectors.vllm:VllmDecode",
    "vllm-persistent": "logitreplay.selectors.vllm:VllmPersistent",
    "vllm-cooperative": "logitreplay.selectors.vllm:VllmCooperative",
    "vllm-deepselect": "logitreplay.selectors.vllm:VllmDeepSelect",
    "vllm-auto": "logitreplay.selectors.vllm:VllmAuto",
}
# The library each adapter uses: selectors of one library from different sources need their own processes.
LIBRARIES: dict[str, KernelLibrary] = {name: (DEEPSELECT if name == "vllm-deepselect" else C_OPS) for name in VLLM}

__all__ = ["LIBRARIES", "VLLM", "DecodeCall", "VllmAuto", "VllmCooperative", "VllmDecode", "VllmDeepSelect",
           "VllmKernel", "VllmPersistent", "VllmPrefill", "decode_call"]
