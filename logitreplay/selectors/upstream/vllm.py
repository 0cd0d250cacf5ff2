"""vLLM 0.33's own top-k kernels as selectors, called exactly as vLLM calls them (the prefill, per-row
decode, persistent and DeepSelect adapters take 0.34's libraries too: see the releases below).

Prefill: `vllm-native` (`torch.ops._C.top_k_per_row_prefill`, `sparse_attn_indexer.py`). Decode, the
backends of `SparseIndexerTopk` (`model_executor/layers/indexer_topk.py`): `vllm-decode`
(`top_k_per_row_decode`, the `per_row` fallback), `vllm-persistent` (`persistent_topk`),
`vllm-cooperative` (`cooperative_topk`), both with the 1 MiB uint8 workspace vLLM's workspace manager hands
them (allocated once in `prepare`), and `vllm-deepselect` (`torch.ops.deep_select.topk` as
`deep_select_topk` calls it; fp32 or bf16, the decode form keeps bf16 logits). `vllm-auto` applies vLLM
0.33's choice per case: the prefill op for a prefill case, and for a decode case the `auto` chain
(cooperative for <= 64 rows, else persistent, for top_k 512/1024/2048; else per_row), and says which.

The libraries are found as vLLM loads them, or from a path (`vllm-native@/path/_C_stable_libtorch.abi3.so`):
vLLM 0.33 registers its top-k ops (`torch.ops._C.*`) in `vllm._C_stable_libtorch`, which
`vllm.platforms.cuda` imports; vLLM 0.22 registered them in `vllm._C` (0.23 moved them; both modules
existed until 0.24). DeepSelect ships as `vllm._deepselect_C` (`torch.ops.deep_select.topk`), imported
only by `vllm.model_executor.layers.indexer_topk`. Two builds of one op cannot be registered in one
process: loading.py refuses the second, and the replay command runs them in processes of their own. vLLM's kernels write a contiguous (rows, top_k) block (no output stride), so an adapter
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
from logitreplay.selectors.upstream.base import Declared, Release, Upstream, fp32_only, staged, starts_at_zero
from logitreplay.selectors.upstream.loading import Source

# The library of the top-k ops, newest layout first, and DeepSelect's; each proven by one op.
C_OPS = Source(("vllm._C_stable_libtorch", "vllm._C"), "vllm", "vllm", "vllm._C_stable_libtorch", "_C",
               "top_k_per_row_prefill")
DEEPSELECT = Source(("vllm._deepselect_C",), "vllm", "vllm", "vllm._deepselect_C", "deep_select", "topk")
# Read from 0.33.0; the op schemas are those of 0.22 (module layout aside) up to 0.34. Checked against
# 0.34.0 (its `_C_stable_libtorch.abi3.so` registers the four schemas unchanged, `indexer_topk.py` and
# `sparse_attn_indexer.py` call the prefill, per-row decode and persistent ops as 0.33 does on SM 9.0:
# float32, persistent's bfloat16 input is for the SM 10.x family only), so those three take 0.34 too.
VLLM_033 = Release(C_OPS, "0.33.0", ("0.22.0", "0.35.0"))
# 0.34 changed cooperative_topk's constraints (bfloat16 input, 16-byte row alignment, no SM 11.x) and so
# the choice of `auto`: 0.33's cooperative and auto take up to 0.33 only; 0.34's are in vllm034.py.
VLLM_033_COOPERATIVE = Release(C_OPS, "0.33.0", ("0.22.0", "0.34.0"))
# 0.34.0 ships the very `_deepselect_C.abi3.so` of 0.33.0 (same sha256, 333f9b25...) and calls it through
# an unchanged `deep_select_topk` and `is_deep_select_supported`.
DEEPSELECT_033 = Release(DEEPSELECT, "0.33.0", ("0.33.0", "0.35.0"))
FP32 = ("float32",)
ANY_K = (1, None)

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
    """A kernel of one of vLLM's libraries; subclasses give the declaration, the op, limits and the launch."""

    op: str = ""  # the op's name in the library's namespace

    def kernel_name(self, case: Case) -> str:
        return self.op

    def _op(self) -> Callable[..., None]:
        loaded = self.find()
        if isinstance(loaded, str):
            raise RuntimeError(loaded)
        return getattr(getattr(torch.ops, str(self.declared.release.source.namespace)), self.op)


def _call(case: Case | None, logits: torch.Tensor) -> DecodeCall:
    """The case's decode call, or one request per row bounded by the width when no case is given."""
    return decode_call(case) if case is not None else DecodeCall(logits.shape[0], 1, logits.shape[1])


class VllmPrefill(VllmKernel):
    """`top_k_per_row_prefill` (sparse_attn_indexer.py l.763): float32, rows with start and end, indices
    relative to the start, -1 tails, rows written `topK` apart."""

    declared = Declared("vllm-native", VLLM_033, FP32, ANY_K, ("decode", "starts", "padded"))
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

    declared = Declared("vllm-decode", VLLM_033, FP32, ANY_K, ("decode", "padded"))
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

    declared = Declared("vllm-persistent", VLLM_033, FP32, (min(FAST_TOP_K), max(FAST_TOP_K)), ("decode", "padded"),
                        FAST_TOP_K)
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

    declared = Declared("vllm-cooperative", VLLM_033_COOPERATIVE, FP32, (min(FAST_TOP_K), max(FAST_TOP_K)), ("decode", "padded"),
                        FAST_TOP_K)
    op = "cooperative_topk"

    @staticmethod
    def constraints(case: Case, device: torch.device) -> str | None:
        """Why vLLM would not pick it for this case beyond the top_k set (`auto` asks the same)."""
        return cooperative_constraints(case, device)

    def limits(self, case: Case, device: torch.device) -> str | None:
        return self.constraints(case, device) or super().limits(case, device)


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
    passed as it is when it meets the output alignment, as vLLM passes its index buffer; else staged.
    Which of the two ran depends on the view alone, so `note` states the rule and `staging_bytes` the most
    it copies: nothing is remembered from one prepare to the next."""

    declared = Declared("vllm-deepselect", DEEPSELECT_033, ("float32", "bfloat16"), (1, DEEPSELECT_MAX_K),
                        ("decode", "padded"))
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

    def kernel_name(self, case: Case) -> str:
        align = self._alignment()[1]
        return f"{self.op} into the view when its rows and base are {align}-byte aligned, else staged"

    def note(self, case: Case) -> str:
        return super().note(case).replace("; staging copy", "; staging copy at most")

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        op = self._op()
        out_align = self._alignment()[1]

        def kernel(idx: torch.Tensor) -> None:
            op(logits, top_k, None, row_ends, False, False, None, idx, None, -1, float("-inf"), False, False)

        if out.stride(1) == 1 and (out.stride(0) * 4) % out_align == 0 and out.data_ptr() % out_align == 0:
            return lambda: kernel(out)
        return staged(kernel, out, out_align // 4)


class VllmAuto(VllmKernel):
    """What vLLM 0.33 runs for each case: `top_k_per_row_prefill` for a prefill case; for a decode case
    `SparseIndexerTopk`'s `auto` resolution (`_resolve_auto`, l.236): cooperative when its constraints
    hold, else persistent for top_k 512/1024/2048, else per_row. The choice is made from the case each
    time it is needed (supports, note, prepare), never remembered. A later release's `auto` names its own
    `cooperative` adapter (whose `constraints` decide) and `version`."""

    declared = Declared("vllm-auto", VLLM_033_COOPERATIVE, FP32, ANY_K, ("decode", "starts", "padded"))
    version = "0.33"
    cooperative: type[VllmCooperative] = VllmCooperative

    def __init__(self, library_path: str | None = None) -> None:
        super().__init__(library_path)
        self._backends: dict[str, VllmKernel] = {
            cls.op: cls(library_path) for cls in (VllmPrefill, self.cooperative, VllmPersistent, VllmDecode)}

    def chosen(self, case: Case | None, device: torch.device) -> VllmKernel:
        if case is None or getattr(case, "kind", "prefill") != "decode":
            return self._backends[VllmPrefill.op]
        if case.top_k in FAST_TOP_K and device.type == "cuda":
            if self.cooperative.constraints(case, device) is None:
                return self._backends[VllmCooperative.op]
            return self._backends[VllmPersistent.op]
        return self._backends[VllmDecode.op]

    def supports(self, case: Case, device: torch.device) -> str | None:
        why = super().supports(case, device)
        if why is not None:
            return why
        backend = self.chosen(case, device)
        why = backend.supports(case, device)
        return None if why is None else f"vLLM runs {backend.op} here, which cannot: {why}"

    def kernel_name(self, case: Case) -> str:
        return f"vLLM {self.version} chose {self.chosen(case, torch.device('cuda')).op}"

    def prepare_case(self, case: Case | None, logits: torch.Tensor, row_starts: torch.Tensor,
                     row_ends: torch.Tensor, top_k: int, out: torch.Tensor) -> Launch:
        return self.chosen(case, logits.device).prepare_case(case, logits, row_starts, row_ends, top_k, out)


__all__ = ["C_OPS", "DEEPSELECT", "DEEPSELECT_033", "VLLM_033", "VLLM_033_COOPERATIVE", "DecodeCall", "VllmAuto",
           "VllmCooperative", "VllmDecode", "VllmDeepSelect", "VllmKernel", "VllmPersistent", "VllmPrefill",
           "decode_call"]
