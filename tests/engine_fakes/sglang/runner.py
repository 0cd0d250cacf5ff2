"""SGLang's model runner as the capture plugin meets it (`sglang.srt.model_executor.model_runner`,
and `.runner`).

The released `model_runner.py` imports the whole server, so the runner is written here from the facts the
plugin relies on, which tests/test_capture_sglang.py checks against the released source:
`ModelRunner.forward(forward_batch)` runs one step under `forward_context(ForwardContext(attn_backend))`
and returns a `ModelRunnerOutput` whose `can_run_graph` says the decode CUDA-graph runner replayed it
(then no Python runs in the layers); the graph runner warms up and captures its batch sizes inside SGLang's
capture mode (the released `runner_utils.capture_mode.model_capture_mode`); eager batches run the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.model_executor.runner_utils.capture_mode import get_is_capture_mode, model_capture_mode

from tests.engine_fakes.sglang.outside import outside_names


@dataclass
class ModelRunnerOutput:
    logits_output: Any
    can_run_graph: bool


class DecodeCudaGraphRunner:
    """Decode graphs for the batch sizes given: `capture` runs each twice in capture mode (a warm-up and
    the captured run); a replay returns the captured run's output without running the layers."""

    def __init__(self, runner: ModelRunner, batches: dict[int, Any]) -> None:
        self.runner, self.batches, self.outputs = runner, batches, {}

    def capture(self) -> None:
        with model_capture_mode():
            for size, batch in self.batches.items():
                for _ in range(2):
                    self.outputs[size] = self.runner.run_model(batch)

    def can_run_graph(self, batch: Any) -> bool:
        return batch.forward_mode.is_cpu_graph() and batch.batch_size in self.outputs

    def execute(self, batch: Any) -> Any:
        return self.outputs[batch.batch_size]


class ModelRunner:
    def __init__(self, model: Any, attn_backend: Any, device: str = "cpu") -> None:
        self.model, self.attn_backend, self.device = model, attn_backend, device
        self.decode_cuda_graph_runner: DecodeCudaGraphRunner | None = None
        self.forward_pass_id = 0

    def run_model(self, batch: Any) -> Any:
        self.attn_backend.init_forward_metadata(batch)
        with forward_context(ForwardContext(attn_backend=self.attn_backend), forward_batch=batch):
            return self.model(batch)

    def forward(self, forward_batch: Any) -> ModelRunnerOutput:
        self.forward_pass_id += 1
        graphs = self.decode_cuda_graph_runner
        if graphs is not None and not get_is_capture_mode() and graphs.can_run_graph(forward_batch):
            return ModelRunnerOutput(graphs.execute(forward_batch), can_run_graph=True)
        return ModelRunnerOutput(self.run_model(forward_batch), can_run_graph=False)


__getattr__ = outside_names(__name__)
