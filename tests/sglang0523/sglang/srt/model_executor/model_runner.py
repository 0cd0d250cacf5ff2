"""`ModelRunner.forward(forward_batch, ...)`: one engine step of a scheduler process. A decode batch the
decode CUDA-graph runner can take is replayed (`execute`: no Python runs in the layers) and the output
says `can_run_graph`; every other batch runs the model eagerly."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.forward_context import set_token_to_kv_pool


@dataclass
class ModelRunnerOutput:
    logits_output: Any
    can_run_graph: bool


class ModelRunner:
    def __init__(self, model: Any, device: str, token_to_kv_pool: Any) -> None:
        self.model = model
        self.device = device
        self.token_to_kv_pool = token_to_kv_pool
        self.decode_cuda_graph_runner: Any = None
        self.forward_pass_id = 0

    def forward(self, forward_batch: ForwardBatch, skip_attn_backend_init: bool | None = None,
                pp_proxy_tensors: Any = None, reinit_attn_backend: bool = False,
                split_forward_count: int = 1) -> ModelRunnerOutput:
        self.forward_pass_id += 1
        return self._forward_raw(forward_batch, split_forward_count)

    def _forward_raw(self, forward_batch: ForwardBatch, split_forward_count: int = 1) -> ModelRunnerOutput:
        set_token_to_kv_pool(self.token_to_kv_pool)
        graph = self.decode_cuda_graph_runner
        can_run_graph = bool(forward_batch.forward_mode.is_decode() and graph and graph.can_run_graph(forward_batch))
        if can_run_graph:
            return ModelRunnerOutput(logits_output=graph.execute(forward_batch), can_run_graph=True)
        ids, positions = forward_batch.extras["input_ids"], forward_batch.extras["positions"]
        return ModelRunnerOutput(logits_output=self.model.forward(ids, positions, forward_batch), can_run_graph=False)
