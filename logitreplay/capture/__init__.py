"""Capture: keep indexer logits from real model runs, with their row bounds and provenance.

`IndexerCapture` hooks a transformers model's indexers; `capture_hf` runs one end to end (`HFRun` says
what to run); `CaptureWriter` stages matrices off the hot path and writes them to an archive; `Policy`
says which calls are kept and `PolicyState` is its running state in one process. The vLLM plugin
(`logitreplay.capture.vllm_plugin`) and the SGLang plugin (`logitreplay.capture.sglang_plugin`, an
`sglang.srt.plugins` entry point), both enabled by `LOGITREPLAY_CAPTURE_DIR`, are loaded by the engine itself
in every process that runs the model; what they share is `logitreplay.capture.serving`.
"""

from logitreplay.capture.hf import HFRun, capture_hf
from logitreplay.capture.hooks import IndexerCapture
from logitreplay.capture.policy import Policy, PolicyState
from logitreplay.capture.writer import CaptureWriter

__all__ = ["CaptureWriter", "HFRun", "IndexerCapture", "Policy", "PolicyState", "capture_hf"]
