"""vllm/v1/attention/backends/mla/indexer.py l.456-476, l.710-714, l.736-753: the indexer metadata."""

from dataclasses import dataclass

import torch


@dataclass
class DeepseekV32IndexerPrefillChunkMetadata:
    block_table: torch.Tensor
    cu_seqlen_ks: torch.Tensor
    cu_seqlen_ke: torch.Tensor
    cu_seq_lens: torch.Tensor
    token_to_seq: torch.Tensor
    total_seq_lens: int
    max_seqlen_k: int
    token_start: int
    token_end: int
    num_reqs: int
    skip_kv_gather: bool = False
    local_cu_seq_lens: torch.Tensor | None = None
    local_total_seq_lens: int = 0
    max_local_total_seq_lens: int = 0
    pcp_deinterleave_idx: torch.Tensor | None = None


@dataclass
class DeepseekV32IndexerPrefillMetadata:
    chunks: list[DeepseekV32IndexerPrefillChunkMetadata]
    max_prefill_seq_len: int = -1
    row_shard_sizes: list[int] | None = None


@dataclass
class DeepseekV32IndexerMetadata:
    seq_lens: torch.Tensor
    max_seq_len: int
    slot_mapping: torch.Tensor
    num_decodes: int
    num_decode_tokens: int
    num_prefills: int
    num_prefill_tokens: int
    decode: object | None = None
    prefill: DeepseekV32IndexerPrefillMetadata | None = None


@dataclass
class DeepSeekV32IndexerDecodeMetadata:
    """l.1753-1764 (the fields the decode branch reads): `seq_lens` (B, next_n) per-row for native MTP,
    else (B, 1); `decode_lens` (B,) query tokens per request."""

    block_table: torch.Tensor
    seq_lens: torch.Tensor
    decode_lens: torch.Tensor
    requires_padding: bool = False
    schedule_metadata: torch.Tensor | None = None
    indices: torch.Tensor | None = None
