"""Staging captured matrices off the model's critical path and writing them as archive cases.

The order of work is chosen so that the model never waits on disk or on the host:
1. on the model's stream, the in-range values are gathered into a fresh device buffer
   (`archive.gather_rows`, a device-to-device pass), so the model may reuse or overwrite its logits
   buffer right after (vLLM does, and leaves it uninitialized outside the bounds anyway);
2. a background thread copies that buffer to pinned host memory on a side stream (CUDA) once an event
   recorded on the model's stream says the gather is done; on CPU the gathered tensor is already host data;
3. the same thread builds the `Case` and writes it with `Archive.write`, which marks the case complete
   last, so a process killed at any point leaves every finished case readable.
The queue between 1 and 2 is bounded (in cases and in device bytes): when it is full the matrix is dropped
and counted, never waited for. Any error in the writer is logged once and turns the writer off.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from logitreplay.archive import Archive, ArchiveError, Case, gather_rows
from logitreplay.capture.policy import Selection

log = logging.getLogger("logitreplay.capture")

DEFAULT_MAX_PENDING = 8
DEFAULT_MAX_PENDING_BYTES = 4 << 30
_WRITERS = itertools.count(1)


@dataclass
class _Staged:
    case_id: str
    layer_name: str
    values: torch.Tensor  # 1-D ragged, on the model's device
    reference: torch.Tensor | None  # (rows, top_k) int32, on the model's device
    row_starts: np.ndarray
    row_ends: np.ndarray
    top_k: int
    cols: int
    row_stride: int
    nbytes: int
    attrs: dict[str, Any]
    ready: torch.cuda.Event | None  # recorded on the model's stream after the gather


class CaptureWriter:
    """Owns the case groups `r<rank>-p<pid>-<start>-<n>-*` of one archive and a background thread writing them.

    Several processes (tensor-parallel ranks, repeated runs) may write into the same archive directory:
    each only creates its own case groups and its own summary file, and never rewrites root attributes.
    """

    def __init__(self, path: str | os.PathLike[str], selection: Selection, *, rank: int = 0,
                 max_pending: int = DEFAULT_MAX_PENDING,
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES) -> None:
        self.path = Path(path)
        self.selection = selection
        self.rank = rank
        # Unique across processes and runs appending to one archive (pids repeat, e.g. in containers) and
        # across writers of one process: rank, pid, start time, and a per-process writer number.
        self.prefix = f"r{rank}-p{os.getpid()}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{next(_WRITERS)}"
        self.archive = _open_archive(self.path)
        self.max_pending_bytes = max_pending_bytes
        self.captured = 0
        self.bytes = 0
        self.widths: dict[str, set[int]] = {}
        self.error: str | None = None
        self._seq = 0
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Staged | None] = queue.Queue(maxsize=max_pending)
        self._side: torch.cuda.Stream | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"logitreplay-writer-{self.prefix}", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        return self.error is not None

    def submit(self, logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
               starts_host: np.ndarray, ends_host: np.ndarray, reference: torch.Tensor | None, *,
               top_k: int, row_stride: int, layer_index: int, layer_name: str, single_request: bool,
               attrs: dict[str, Any]) -> bool:
        """Offer one matrix (called on the model's thread, inside its stream). Returns whether it was kept.

        `logits` is the (rows, cols) matrix view the kernel read; `starts`/`ends` its row bounds on the
        same device and `starts_host`/`ends_host` the same bounds already on the host. Never blocks.
        """
        cols = int(logits.shape[1])
        nbytes = int((ends_host.astype(np.int64) - starts_host.astype(np.int64)).sum()) * logits.element_size()
        if not self.selection.admit(layer_index, cols, nbytes, single_request):
            return False
        if self.failed or self._closed:
            self.selection.drop("writer_off")
            return False
        with self._lock:
            full = self._queue.full() or self._pending_bytes + nbytes > self.max_pending_bytes
            if not full:
                self._pending_bytes += nbytes
        if full:
            self.selection.drop("queue_full")
            return False
        values = gather_rows(logits, starts, ends)
        ref = None if reference is None else reference.to(torch.int32).clone(memory_format=torch.contiguous_format)
        ready = None
        if values.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(values.device))
        self._seq += 1
        case_id = f"{self.prefix}-{self._seq:05d}-L{layer_index:02d}-w{cols}"
        attrs = {**attrs, "capture_policy": self.selection.policy.describe(), "rank": self.rank,
                 "created": _now()}
        item = _Staged(case_id, layer_name, values, ref, starts_host.astype(np.int32), ends_host.astype(np.int32),
                       int(top_k), cols, int(row_stride), nbytes, attrs, ready)
        self._queue.put_nowait(item)  # cannot be full: only this thread puts, and it checked above
        self.selection.record(layer_index, cols, nbytes)
        return True

    def close(self) -> dict[str, Any]:
        """Write everything still queued, stop the thread, and write this writer's run summary."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._thread.join()
            self._write_summary()
        return self.summary()

    def summary(self) -> dict[str, Any]:
        sel = self.selection
        return {
            "archive": str(self.path),
            "rank": self.rank,
            "pid": os.getpid(),
            "captured": self.captured,
            "bytes": self.bytes,
            "dropped": dict(sorted(sel.dropped.items())),
            "skipped": dict(sorted(sel.skipped.items())),
            "widths": {name: sorted(w) for name, w in sorted(self.widths.items())},
            "policy": sel.policy.describe(),
            "error": self.error,
        }

    # -- background thread

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if self.failed:
                    self.selection.drop("writer_off")
                    continue
                values, reference = self._to_host(item)
                case = Case.from_rows(item.case_id, values, item.row_starts, item.row_ends, top_k=item.top_k,
                                      cols=item.cols, row_stride=item.row_stride, reference_indices=reference,
                                      attrs=item.attrs)
                self.archive.write(case)
                with self._lock:
                    self.captured += 1
                    self.bytes += item.nbytes
                    self.widths.setdefault(item.layer_name, set()).add(item.cols)
            except Exception as e:  # a full disk or a bad case must not reach the model: log once, stop
                self._fail(f"writing case {item.case_id}: {type(e).__name__}: {e}")
                self.selection.drop("writer_error")
            finally:
                with self._lock:
                    self._pending_bytes -= item.nbytes

    def _to_host(self, item: _Staged) -> tuple[torch.Tensor, torch.Tensor | None]:
        if item.ready is None:
            return item.values, item.reference
        device = item.values.device
        with torch.cuda.device(device):
            if self._side is None:
                self._side = torch.cuda.Stream(device)
            with torch.cuda.stream(self._side):
                self._side.wait_event(item.ready)
                host = [_pinned_copy(t) if t is not None else None for t in (item.values, item.reference)]
            self._side.synchronize()
        # The device buffers are released here, after the copy finished, back to the model stream's pool.
        item.values = item.reference = None  # type: ignore[assignment]
        assert host[0] is not None
        return host[0], host[1]

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            log.error("logitreplay capture disabled: %s", message)

    def _write_summary(self) -> None:
        # Its own file per writer: root attributes are shared by every writer and must not be rewritten.
        target = self.path / f"capture-summary-{self.prefix}.json"
        data = {**self.summary(), "written": _now()}
        try:
            tmp = target.with_name(target.name + ".partial")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, target)
        except OSError as e:
            self._fail(f"writing summary {target}: {e}")


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _open_archive(path: Path) -> Archive:
    """Create or reopen the archive; another rank may be creating it at the same moment, so retry briefly
    while its metadata appears (a directory that is not an archive fails at once)."""
    deadline = time.monotonic() + 5.0
    while True:
        try:
            return Archive.create(path)
        except ArchiveError:
            if not (path / "zarr.json").exists() or time.monotonic() > deadline:
                raise
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


__all__ = ["CaptureWriter", "DEFAULT_MAX_PENDING", "DEFAULT_MAX_PENDING_BYTES"]
