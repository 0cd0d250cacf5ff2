"""DeepSeek V3.2 in SGLang 0.5.23, reduced to the module tree around the DSA indexer: the causal LM's
`model.layers.N.self_attn.indexer`, each `Indexer` built with its `layer_id` (it keeps no name of its own)."""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.layers.attention.dsa.dsa_indexer import Indexer
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from torch import nn


class DeepseekV2AttentionMLA(nn.Module):
    def __init__(self, config: Any, layer_id: int, prefix: str = "") -> None:
        super().__init__()
        self.layer_id = layer_id
        self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=False)
        self.indexer = Indexer(hidden_size=config.hidden_size, index_n_heads=config.index_n_heads,
                               index_head_dim=config.index_head_dim, rope_head_dim=0,
                               index_topk=config.index_topk, q_lora_rank=config.q_lora_rank,
                               max_position_embeddings=1 << 20, rope_theta=10000.0, scale_fmt="ue8m0",
                               block_size=128, prefix=f"{prefix}.indexer", layer_id=layer_id)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> Any:
        q_lora = self.q_a_proj(hidden_states)
        return self.indexer(hidden_states, q_lora, positions, forward_batch, self.layer_id)


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_id: int, prefix: str = "") -> None:
        super().__init__()
        self.self_attn = DeepseekV2AttentionMLA(config, layer_id, prefix=f"{prefix}.self_attn")

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> Any:
        return self.self_attn(positions, hidden_states, forward_batch)


class DeepseekV2Model(nn.Module):
    def __init__(self, config: Any, prefix: str = "") -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DeepseekV2DecoderLayer(config, i, prefix=f"{prefix}.layers.{i}")
                                    for i in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch) -> Any:
        hidden_states = self.embed_tokens(input_ids)
        return [layer(positions, hidden_states, forward_batch) for layer in self.layers]


class DeepseekV2ForCausalLM(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.model = DeepseekV2Model(config, prefix="model")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: ForwardBatch) -> Any:
        return self.model(input_ids, positions, forward_batch)
