"""The decode CUDA-graph runner: `capture` runs each batch size's forward eagerly in capture mode (warm-up),
then captures it in a CUDA graph; `execute` replays the graph of the batch's size (on CPU it returns the
captured run's output: there is no graph, and no Python of the layers runs either way). The warm-up and
capture runs call the model directly, not `ModelRunner.forward`, so `capture_one_shape` publishes the
forward's KV pool itself, as SGLang's does with `forward_context(ForwardContext(attn_backend=...))`
around them (the indexer reads the pool through `get_token_to_kv_pool()`)."""

from __future__ import annotations

from typing import Any

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch
from sglang.srt.model_executor.forward_context import set_token_to_kv_pool
from sglang.srt.model_executor.runner_utils.capture_mode import model_capture_mode


class DecodeCudaGraphRunner:
    def __init__(self, model_runner: Any, batches: dict[int, ForwardBatch]) -> None:
        self.model_runner = model_runner
        self.batches = batches  # the static inputs of each captured batch size
        self.graphs: dict[int, Any] = {}
        self.outputs: dict[int, Any] = {}

    def can_run_graph(self, forward_batch: ForwardBatch) -> bool:
        return forward_batch.batch_size in self.graphs

    def capture(self) -> None:
        with model_capture_mode():
            for bs in sorted(self.batches):
                self.capture_one_shape(bs)

    def capture_one_shape(self, size: int) -> None:
        batch = self.batches[size]
        model = self.model_runner.model
        ids, positions = batch.extras["input_ids"], batch.extras["positions"]
        set_token_to_kv_pool(self.model_runner.token_to_kv_pool)
        for _ in range(2):  # warm-up runs, eager
            model.forward(ids, positions, batch)
        if torch.device(self.model_runner.device).type == "cuda":
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs[size] = model.forward(ids, positions, batch)
            self.graphs[size] = graph
        else:
            self.outputs[size] = model.forward(ids, positions, batch)
            self.graphs[size] = None

    def execute(self, forward_batch: ForwardBatch) -> Any:
        graph = self.graphs[forward_batch.batch_size]
        if graph is not None:
            graph.replay()
        return self.outputs[forward_batch.batch_size]
