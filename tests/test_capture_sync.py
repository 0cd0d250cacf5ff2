"""Capture never synchronises the model's thread with its device: reading a device value on the host drains
the model's stream and leaves the GPU idle while Python launches the next kernels.

On CUDA the proof is torch's sync debug mode set to error: any synchronising call raises where it is made.
On CPU there is nothing to wait for, so `no_host_sync` stands in with a function mode on the calling thread
(modes are per thread: the writer thread is not watched) that refuses the calls which read tensor data on
the host or whose output size depends on it, each a sync on CUDA. The hooks and the vLLM plugin swallow
errors by design (they turn capture off), so a refused call shows as the capture's error and in
`HostReads.calls`. The front ends' own tests use these helpers with their models.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from logitreplay.archive import Archive
from logitreplay.capture.policy import Policy, PolicyState
from logitreplay.capture.writer import CaptureWriter

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
_T = torch.Tensor
_READS = frozenset({_T.item, _T.tolist, _T.numpy, _T.cpu, _T.__bool__, _T.__int__, _T.__float__, _T.__index__,
                    torch.nonzero, _T.nonzero, torch.masked_select, _T.masked_select, torch.unique, _T.unique})
_SIZED = frozenset({torch.repeat_interleave, _T.repeat_interleave})  # a sync unless output_size is given


class HostReads(TorchFunctionMode):
    """Refuses (and records) every call that would synchronise a CUDA host thread with its stream."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Sequence[Any] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if _syncs(func, args, kwargs):
            self.calls.append(func.__name__)
            raise RuntimeError(f"host sync on the model's thread: {func.__name__}")
        return func(*args, **kwargs)


def _syncs(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    if func in _SIZED:
        return kwargs.get("output_size") is None
    if func is _T.__getitem__:  # indexing by a boolean mask needs the count of its true cells
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)
    return func in _READS


@contextmanager
def no_host_sync(device: str | torch.device) -> Iterator[None]:
    """Every synchronising call made on this thread inside the block raises; on CPU the block also fails
    the test afterwards, since the code under test may have swallowed the error."""
    if torch.device(device).type == "cuda":
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("default")
    else:
        with HostReads() as reads:
            yield
        assert not reads.calls, f"host reads on the model's thread: {reads.calls}"


@contextmanager
def held(writer: CaptureWriter) -> Iterator[None]:
    """The writer thread leaves staged matrices alone until the block ends: CUDA's sync debug mode is
    process-wide, and the writer's own wait on its side stream is allowed."""
    release = threading.Event()
    to_host = writer._to_host

    def wait_then_copy(item: Any) -> list[torch.Tensor]:
        release.wait(60)
        return to_host(item)

    writer._to_host = wait_then_copy  # type: ignore[method-assign]
    try:
        yield
    finally:
        release.set()


def test_the_cpu_stand_in_refuses_what_syncs_on_cuda() -> None:
    t = torch.tensor([3, 1, 2])
    for read in (lambda: t.cpu(), lambda: int(t.sum()), lambda: t.tolist(), lambda: t.numpy(),
                 lambda: torch.repeat_interleave(t, t), lambda: bool(t.any()), lambda: t[t > 1]):
        with pytest.raises(AssertionError, match="host reads"), no_host_sync("cpu"), pytest.raises(RuntimeError):
            read()
    with no_host_sync("cpu"):  # what capture does on the model's thread instead
        torch.repeat_interleave(t, t, output_size=6)
        torch.stack([t, t.cumsum(0)]).clone().argmax(-1)


@pytest.mark.parametrize("device", DEVICES)
def test_submit_stages_without_a_sync(device: str, tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("single-request")))
    logits = torch.randn(64, 256, device=device)
    starts = torch.zeros(64, dtype=torch.int32, device=device)
    ends = torch.arange(193, 257, dtype=torch.int32, device=device)
    ref = torch.zeros(64, 8, dtype=torch.int32, device=device)
    with held(writer), no_host_sync(device):
        for layer in (0, 0, 1):  # the default policy decides from shapes alone: layer 0 once, layer 1 once
            if writer.selection.wants(layer, 256):
                writer.submit(logits, starts, ends, ref, top_k=8, row_stride=256, layer_index=layer,
                              layer_name=f"layers.{layer}", requests=None, attrs={"device": device})
    summary = writer.close()
    assert summary["captured"] == 2 and summary["error"] is None and summary["skipped"] == {}
    assert summary["bytes"] == 2 * 4 * int((ends - starts).sum())
    for case in Archive.open(tmp_path / "cap.zarr"):
        assert case.attrs["chunk"] == {"requests": 1}
        for r in (0, 63):
            assert torch.equal(case.row(r), logits[r, :193 + r].cpu())
