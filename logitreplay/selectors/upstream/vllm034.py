"""What vLLM 0.34 changed in the top-k calls that run on an H100 or H200: `cooperative_topk` on bfloat16
logits, and so the choice `auto` makes.

Read from vllm 0.34.0 (`model_executor/layers/indexer_topk.py`, `sparse_attn_indexer.py`, the ops'
schemas in `_C_stable_libtorch.abi3.so`): `top_k_per_row_prefill`, `top_k_per_row_decode`,
`persistent_topk` and `cooperative_topk` keep 0.33's schemas, and the library has sm_90 cubins. The
prefill, per-row decode and persistent calls are 0.33's on SM 9.0, so vllm.py's adapters take a 0.34
library (`vllm-native@/path/vllm-0.34.0`). New in 0.34:
- the decode chain (`_resolve_auto`: cooperative, persistent, per_row, unchanged) hands `cooperative_topk`
  bfloat16 logits as they are (`takes_bf16_logits`), with rows TMA-loaded in 16-byte units (a row stride
  of a multiple of 8 bfloat16 or 4 float32 elements), on SM 9.0 or newer outside the SM 11.x and 12.x
  families: `vllm034-cooperative`, and `vllm034-auto` choosing with those constraints. A bfloat16 case
  that `auto` sends to persistent or per-row is upcast to float32 by vLLM first (a copy of its own), so
  `vllm034-auto` declines it with the backend's reason;
- DeepSelect in prefill (the `deep_select` backend on bfloat16 logits) and in decode run only on the SM
  10.x family (`_has_deep_select`), and `vllm._deepselect_C` (the very file of 0.33) holds sm_100 cubins
  only: on sm_90 they never run, and `vllm-deepselect` says so;
- `fused_mqa_topk_prefill` computes the indexer's logits and their top-k in one kernel from the queries
  and keys (no logits to replay), on the SM 10.x family only (`fused_mqa_topk_available`).
"""

from __future__ import annotations

import torch

from logitreplay.archive import ELEMENT_BYTES, Case
from logitreplay.selectors.upstream.base import Declared, Release, starts_at_zero
from logitreplay.selectors.upstream.vllm import (
    ANY_K,
    AUTO_COOPERATIVE_MAX_ROWS,
    C_OPS,
    FAST_TOP_K,
    VllmAuto,
    VllmCooperative,
)

VLLM_034 = Release(C_OPS, "0.34.0", ("0.34.0", "0.35.0"))
TMA_ROW_BYTES = 16
DTYPES = ("float32", "bfloat16")


class VllmCooperative034(VllmCooperative):
    """`cooperative_topk(logits, seq_lens, output, workspace, k, max_seq_len)` as 0.34 calls it: float32 or
    bfloat16 logits, top_k 512/1024/2048, at most 64 rows, rows from column 0."""

    declared = Declared("vllm034-cooperative", VLLM_034, DTYPES, (min(FAST_TOP_K), max(FAST_TOP_K)),
                        ("decode", "padded"), FAST_TOP_K)

    @staticmethod
    def constraints(case: Case, device: torch.device) -> str | None:
        """0.34's `_cooperative_constraints`, beyond the top_k set."""
        major, _ = torch.cuda.get_device_capability(device)
        if major < 9 or major in (11, 12):
            return f"cooperative_topk needs SM 9.0 or newer, not SM 11.x or 12.x (this GPU is SM {major}.x)"
        if case.rows > AUTO_COOPERATIVE_MAX_ROWS:
            return f"{case.rows} rows: cooperative_topk takes at most {AUTO_COOPERATIVE_MAX_ROWS}"
        align = TMA_ROW_BYTES // ELEMENT_BYTES[case.dtype]
        if case.row_stride % align:
            return f"row stride {case.row_stride} is not a multiple of {align} elements (16-byte TMA rows)"
        return None

    def limits(self, case: Case, device: torch.device) -> str | None:
        if case.top_k not in FAST_TOP_K:
            return f"top_k {case.top_k}: built for top_k in {FAST_TOP_K} only"
        return self.constraints(case, device) or starts_at_zero(case, "decode kernels take row lengths only")


class VllmAuto034(VllmAuto):
    """What vLLM 0.34 runs for each case: 0.33's choice with 0.34's cooperative constraints, and bfloat16
    logits where it hands them to `cooperative_topk` as they are."""

    declared = Declared("vllm034-auto", VLLM_034, DTYPES, ANY_K, ("decode", "starts", "padded"))
    version = "0.34"
    cooperative = VllmCooperative034


__all__ = ["VLLM_034", "VllmAuto034", "VllmCooperative034"]
