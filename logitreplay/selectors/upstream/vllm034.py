"""vLLM 0.34's `cooperative_topk` on bfloat16 logits: what 0.34 adds that runs on an H100 or H200.

Read from vllm 0.34.0 (`model_executor/layers/indexer_topk.py`, the ops' schemas in
`_C_stable_libtorch.abi3.so`): `top_k_per_row_prefill`, `top_k_per_row_decode`, `persistent_topk` and
`cooperative_topk` keep 0.33's schemas, and the library has sm_90 cubins. New in 0.34: the decode chain
(`_resolve_auto`: cooperative, persistent, per_row) hands `cooperative_topk` bfloat16 logits as they
are (`takes_bf16_logits`), with rows TMA-loaded in 16-byte units (a row stride of a multiple of 8
bfloat16 or 4 float32 elements), on SM 9.0 or newer outside the SM 11.x and 12.x families. The new
prefill path through DeepSelect, and DeepSelect in decode, run only on the SM 10.x family
(`_has_deep_select`), and `vllm._deepselect_C` holds sm_100 cubins only: on sm_90 they never run, and
`vllm-deepselect` says so. So the one new column for Hopper is `vllm034-cooperative`; the other ops of a
0.34 library run under the 0.33 names (`vllm-native@/path/0.34/_C_stable_libtorch.abi3.so`).
"""

from __future__ import annotations

import torch

from logitreplay.archive import ELEMENT_BYTES, Case
from logitreplay.selectors.upstream.base import Declared, Release, starts_at_zero
from logitreplay.selectors.upstream.vllm import AUTO_COOPERATIVE_MAX_ROWS, C_OPS, FAST_TOP_K, VllmCooperative

VLLM_034 = Release(C_OPS, "0.34.0", ("0.34.0", "0.35.0"))
TMA_ROW_BYTES = 16


class VllmCooperative034(VllmCooperative):
    """`cooperative_topk(logits, seq_lens, output, workspace, k, max_seq_len)` as 0.34 calls it: float32 or
    bfloat16 logits, top_k 512/1024/2048, at most 64 rows, rows from column 0."""

    declared = Declared("vllm034-cooperative", VLLM_034, ("float32", "bfloat16"),
                        (min(FAST_TOP_K), max(FAST_TOP_K)), ("decode", "padded"), FAST_TOP_K)

    def limits(self, case: Case, device: torch.device) -> str | None:
        major, _ = torch.cuda.get_device_capability(device)
        if major < 9 or major in (11, 12):
            return f"cooperative_topk needs SM 9.0 or newer, not SM 11.x or 12.x (this GPU is SM {major}.x)"
        if case.top_k not in FAST_TOP_K:
            return f"top_k {case.top_k}: built for top_k in {FAST_TOP_K} only"
        if case.rows > AUTO_COOPERATIVE_MAX_ROWS:
            return f"{case.rows} rows: cooperative_topk takes at most {AUTO_COOPERATIVE_MAX_ROWS}"
        align = TMA_ROW_BYTES // ELEMENT_BYTES[case.dtype]
        if case.row_stride % align:
            return f"row stride {case.row_stride} is not a multiple of {align} elements (16-byte TMA rows)"
        return starts_at_zero(case, "decode kernels take row lengths only")


__all__ = ["VLLM_034", "VllmCooperative034"]
