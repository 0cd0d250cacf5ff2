"""vllm/v1/worker/gpu/model_runner.py (Model Runner V2, the default where supported): `execute_model(
scheduler_output, intermediate_tensors=None, dummy_run=False, skip_attn_for_dummy_run=False,
is_profile=False, context_len=0, valid_dummy_state_slots=False, randomize_inputs=False)` (l.1764) runs the
model under `set_forward_context` (l.2068) and returns None for `sample_tokens` (l.2149); its `_dummy_run`
(l.839) calls `self.execute_model(..., dummy_run=True, ...)` (l.920). The stand-in's scheduler output is
V1's stand-in (it carries the metadata the runner builds)."""

from typing import Any

import torch
from vllm.forward_context import set_forward_context
from vllm.v1.worker.gpu_model_runner import EMPTY_MODEL_RUNNER_OUTPUT


class GPUModelRunner:
    def __init__(self, layers: list[Any], device: torch.device | str = "cpu") -> None:
        self.layers = layers
        self.device = torch.device(device)  # as the real runner's `self.device`
        self.execute_model_state: Any = None

    def execute_model(self, scheduler_output, intermediate_tensors=None, dummy_run=False,
                      skip_attn_for_dummy_run=False, is_profile=False, context_len=0,
                      valid_dummy_state_slots=False, randomize_inputs=False):
        if not dummy_run and scheduler_output.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        attn_metadata = {layer.indexer.k_cache.prefix: scheduler_output.attn_metadata for layer in self.layers}
        hidden_states = torch.zeros(scheduler_output.total_num_scheduled_tokens, 8)
        with set_forward_context(attn_metadata):
            for layer in self.layers:
                layer._sparse_indexer_and_attn(hidden_states, scheduler_output.index_q, None,
                                               scheduler_output.index_weights)
        if dummy_run:
            return None
        self.execute_model_state = (scheduler_output, hidden_states)
        return None

    def sample_tokens(self, grammar_output=None):
        self.execute_model_state = None
        return EMPTY_MODEL_RUNNER_OUTPUT

    def _dummy_run(self, scheduler_output, skip_attn=False, is_profile=False):
        self.execute_model(scheduler_output, intermediate_tensors=None, dummy_run=True,
                           skip_attn_for_dummy_run=skip_attn, is_profile=is_profile)
