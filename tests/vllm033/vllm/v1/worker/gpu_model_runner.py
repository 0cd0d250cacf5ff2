"""vllm/v1/worker/gpu_model_runner.py (V1 runner): `GPUModelRunner.execute_model(scheduler_output,
intermediate_tensors=None)` (l.3906-4252) builds the step's attention metadata, runs the model once
through `_model_forward` (l.3586) under `set_forward_context(attn_metadata, ...)` and returns None, leaving
`execute_model_state` for `sample_tokens` (l.4270). `_dummy_run` (l.5447) runs the model outside it, as
`profile_run` (l.6072) does. The stand-in's scheduler output carries the metadata the real runner builds
from it (`_build_attention_metadata`), and the model is the list of attention layers."""

from dataclasses import dataclass
from typing import Any

import torch
from vllm.forward_context import set_forward_context


@dataclass
class SchedulerOutput:
    total_num_scheduled_tokens: int
    attn_metadata: Any  # one layer's DeepseekV32IndexerMetadata: every layer's indexer reads it
    index_q: torch.Tensor
    index_weights: torch.Tensor


EMPTY_MODEL_RUNNER_OUTPUT = object()


class GPUModelRunner:
    def __init__(self, layers: list[Any], device: torch.device | str = "cpu") -> None:
        self.layers = layers
        self.device = torch.device(device)  # as the real runner's `self.device`
        self.execute_model_state: Any = None

    def _model_forward(self, hidden_states, index_q, index_weights):
        for layer in self.layers:
            layer._sparse_indexer_and_attn(hidden_states, index_q, None, index_weights)
        return hidden_states

    def execute_model(self, scheduler_output, intermediate_tensors=None):
        if self.execute_model_state is not None:
            raise RuntimeError("State error: sample_tokens() must be called after execute_model() returns None.")
        num_scheduled_tokens = scheduler_output.total_num_scheduled_tokens
        if not num_scheduled_tokens:
            return EMPTY_MODEL_RUNNER_OUTPUT
        attn_metadata = {layer.indexer.k_cache.prefix: scheduler_output.attn_metadata for layer in self.layers}
        with set_forward_context(attn_metadata):
            model_output = self._model_forward(torch.zeros(num_scheduled_tokens, 8), scheduler_output.index_q,
                                               scheduler_output.index_weights)
        self.execute_model_state = (scheduler_output, model_output)
        return None

    def sample_tokens(self, grammar_output=None):
        self.execute_model_state = None
        return EMPTY_MODEL_RUNNER_OUTPUT

    def _dummy_run(self, scheduler_output):
        attn_metadata = {layer.indexer.k_cache.prefix: scheduler_output.attn_metadata for layer in self.layers}
        with set_forward_context(attn_metadata):
            return self._model_forward(torch.zeros(scheduler_output.total_num_scheduled_tokens, 8),
                                       scheduler_output.index_q, scheduler_output.index_weights)

    def profile_run(self, scheduler_output):
        self._dummy_run(scheduler_output)
