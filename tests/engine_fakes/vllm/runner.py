"""vLLM's model runners, as far as the plugin sees them: a class `GPUModelRunner` in each runner module of
a release (0.33: V1 `vllm.v1.worker.gpu_model_runner` and V2 `vllm.v1.worker.gpu.model_runner`; 0.34: V2
alone) whose `execute_model(scheduler_output, ..., dummy_run=False)` runs one step's forward and returns
None (the engine calls `sample_tokens` next); V2's `_dummy_run` calls `execute_model(dummy_run=True)`,
V1's `profile_run` runs the model outside `execute_model`. The released runners build a whole model;
these run the layers of `Model` through the released indexer op.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any

import torch

from tests.engine_fakes.vllm import prefill

V1, V2 = "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"


class Indexer:
    """What `calling_layer` looks for: an indexer with its op and the module path that names it."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.indexer_op = object()


class Attention:
    """An attention layer owning an indexer; its forward hands the step to the released op."""

    def __init__(self, index: int) -> None:
        self.indexer = Indexer(f"model.layers.{index}.self_attn.indexer")
        self.index = index

    def forward(self, step: prefill.Step, meta: Any, **options: Any) -> torch.Tensor:
        return prefill.run(step, meta, layer=self.index, **options)


@dataclass
class Scheduled:
    """One step's work: the rows and the indexer metadata vLLM's builder would hand every layer."""

    step: prefill.Step
    meta: Any
    options: dict[str, Any]


def execute_model(self: Any, scheduled: Scheduled, intermediate_tensors: Any = None, dummy_run: bool = False,
             **_: Any) -> None:
    for layer in self.layers:
        layer.forward(scheduled.step, scheduled.meta, **scheduled.options)


class _Runner:
    def __init__(self, layers: list[Attention]) -> None:
        self.layers = layers
        self.device = torch.device("cpu")

    def sample_tokens(self, grammar_output: Any = None) -> None:
        return None


def v1(name: str) -> types.ModuleType:
    class GPUModelRunner(_Runner):
        execute_model = execute_model

        def profile_run(self, scheduled: Scheduled) -> None:
            execute_model(self, scheduled)

    module = types.ModuleType(name)
    module.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    return module


def v2(name: str) -> types.ModuleType:
    class GPUModelRunner(_Runner):
        execute_model = execute_model

        def _dummy_run(self, scheduled: Scheduled) -> None:
            self.execute_model(scheduled, dummy_run=True)

    module = types.ModuleType(name)
    module.GPUModelRunner = GPUModelRunner  # type: ignore[attr-defined]
    return module


RUNNERS = {V1: v1, V2: v2}
