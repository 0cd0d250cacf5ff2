"""Staging captured matrices off the model's critical path and writing them as archive cases.

The order of work is chosen so that the model never waits on disk or on the host, and its thread never
waits on the device: reading any device value on the host (the row bounds, a byte count) would drain the
model's stream and leave the GPU idle while Python launches the next kernels.
1. on the model's stream, the whole (rows, cols) matrix, the row bounds and the reference indices are
   copied into fresh device buffers (device-to-device, no sync), so the model may reuse or overwrite its
   logits buffer right after (vLLM does, and leaves it uninitialized outside the bounds anyway); an event
   recorded behind the copies is handed to the writer thread with them;
2. the writer thread copies those buffers to pinned host memory on a side stream once the event says they
   are ready (it waits on that stream, never on the model's); on CPU the copies are already host data;
3. on the host, the same thread checks the bounds, counts the exact in-range bytes, applies what the policy
   could not decide from shapes (single-request-only), gathers each row's [start, end) into the ragged
   values, and writes the `Case` with `Archive.write`, which marks the case complete last, so a process
   killed at any point leaves every finished case readable. The run summary is rewritten (atomically)
   after every case, so even a process killed with SIGKILL leaves one that counts its finished cases;
   `close` writes the final one.
Staging the whole matrix costs more device memory than its in-range cells, but their count is only known
after a sync. The queue between 1 and 2 is bounded (in cases and in staged device bytes): when it is full
the matrix is dropped and counted, never waited for. Any error in the writer is logged once and turns the
writer off.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from logitreplay.archive import Archive, Case, utc_now
from logitreplay.archive.decode import capture_rows
from logitreplay.capture.policy import PolicyState, decode_rows
from logitreplay.errors import ArchiveError

log = logging.getLogger("logitreplay.capture")

DEFAULT_MAX_PENDING = 8
DEFAULT_MAX_PENDING_BYTES = 4 << 30
_WRITERS = itertools.count(1)
# A front end's host step of one case, on the writer thread: (reference indices as the production call wrote
# them, its extra tensors on the host, row starts, row ends) -> (reference in the archive's semantics, attrs
# to add). SGLang's fused top-k writes page-table slots or offset positions, mapped back to row indices here.
Finish = Callable[[np.ndarray | None, dict[str, np.ndarray], np.ndarray, np.ndarray],
                  tuple[np.ndarray | None, dict[str, Any]]]


@dataclass
class _Staged:
    layer_index: int
    layer_name: str
    # On the model's device until the writer copies them: the (rows, cols) matrix, the (len(bound_rows),
    # rows) int64 bounds (starts, ends[, attended][, key_offsets]), and the (rows, top_k) int32 reference
    # indices when there are any.
    tensors: tuple[torch.Tensor, ...]
    ready: torch.cuda.Event | None  # recorded on the model's stream after the copies
    top_k: int
    cols: int
    row_stride: int
    requests: int | None
    bound_rows: tuple[str, ...]
    charged: int  # bytes the policy's budget was charged (the whole matrix), settled once exact
    staged: int  # device bytes held until the case is written
    attrs: dict[str, Any]
    extras: tuple[str, ...] = ()  # names of the tensors after the reference, staged for `finish`
    finish: Finish | None = None


class CaptureWriter:
    """Owns the case groups `r<rank>-p<pid>-<start>-<n>-*` of one archive and a background thread writing them.

    Several processes (tensor-parallel ranks, repeated runs) may write into the same archive directory:
    each only creates its own case groups and its own summary file, and never rewrites root attributes.
    """

    def __init__(self, path: str | os.PathLike[str], selection: PolicyState, *, rank: int = 0,
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
        # Sections a front end adds to the run summary, by name (the vLLM plugin's `tensor_parallel`).
        # Per-forward records of every indexer call seen (stored or not) belong here too, as `calls`.
        self.notes: dict[str, Any] = {}
        self.unwritten = 0  # matrices still queued when `close` gave up waiting
        self._seq = 0
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Staged | None] = queue.Queue(maxsize=max_pending)
        self._sides: dict[torch.device, torch.cuda.Stream] = {}
        self._closed = False
        self._summary_lock = threading.Lock()
        self._final_written = False
        self._thread = threading.Thread(target=self._run, name=f"logitreplay-writer-{self.prefix}", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> bool:
        return self.error is not None

    def submit(self, matrix: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, reference: torch.Tensor | None,
               *, top_k: int, row_stride: int, layer_index: int, layer_name: str, requests: int | None,
               attrs: dict[str, Any], attended: torch.Tensor | None = None,
               key_offsets: torch.Tensor | None = None, extras: dict[str, torch.Tensor] | None = None,
               finish: Finish | None = None) -> bool:
        """Offer one matrix (called on the model's thread, inside its stream). Returns whether it was staged.

        `matrix` is the (rows, cols) view the kernel read and `starts`/`ends` its row bounds, on the same
        device; nothing here reads device data on the host, so it never blocks on the model's stream.
        `requests` is the number of requests the rows belong to when the caller knows it (a batch, vLLM's
        `chunk.num_reqs`), None when only device data does: then it is counted on the host, from
        `key_offsets` when given, else as the distinct row starts. `key_offsets` is each row's offset in
        its chunk's key buffer (vLLM's `cu_seqlen_ks`: constant within a request), needed where every row
        starts at column 0 (vLLM's compressed logits); the case records it as runs of rows
        (`chunk.row_key_offsets`). `attended`, when given, is each row's number of columns the bounds were
        derived from: a row whose [start, end) spans a different number does not fit the format, and
        fails the writer. `extras` are further device tensors the case needs (a page table the model
        rewrites in place), staged like the rest and handed on the host to `finish`, which maps the
        reference and adds attributes. Raises only for tensors of mismatched shapes.
        """
        rows, cols = (int(n) for n in matrix.shape)
        named = {"starts": starts, "ends": ends, "attended": attended, "key_offsets": key_offsets}
        for name, t in named.items():
            if t is not None and tuple(t.shape) != (rows,):
                raise ValueError(f"{layer_name}: {name} of shape {tuple(t.shape)} for a matrix of {rows} rows")
        charged = matrix.numel() * matrix.element_size()
        if not self.selection.admit(layer_index, cols, charged, single_request=requests in (None, 1)):
            return False
        if self.failed or self._closed:
            self.selection.drop("writer_off")
            return False
        extras = dict(extras or {})
        staged = (charged + (0 if reference is None else reference.numel() * 4)
                  + sum(t.numel() * t.element_size() for t in extras.values()))
        with self._lock:
            full = self._queue.full() or self._pending_bytes + staged > self.max_pending_bytes
            if not full:
                self._pending_bytes += staged
        if full:
            self.selection.drop("queue_full")
            return False
        given = {name: t for name, t in named.items() if t is not None}
        bound_rows = tuple(given)
        tensors: tuple[torch.Tensor, ...] = (
            matrix.clone(memory_format=torch.contiguous_format),
            torch.stack([t.to(torch.int64) for t in given.values()]))
        if reference is not None:
            tensors += (reference.to(torch.int32, copy=True, memory_format=torch.contiguous_format),)
        tensors += tuple(t.clone(memory_format=torch.contiguous_format) for t in extras.values())
        ready = None
        if matrix.is_cuda:
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(matrix.device))
        self._queue.put_nowait(_Staged(layer_index, layer_name, tensors, ready, int(top_k), cols, int(row_stride),
                                       requests, bound_rows, charged, staged, attrs, tuple(extras), finish))
        # (not full: only this thread puts)
        self.selection.record(layer_index, cols, charged, decode_rows(attrs.get("kind"), rows))
        return True

    def note(self, section: str, value: Any) -> None:
        """Set one section of the run summary (any thread; written with the next summary)."""
        with self._lock:
            self.notes[section] = value

    def close(self, timeout: float | None = None) -> dict[str, Any]:
        """Write everything still queued, stop the thread, and write this writer's final run summary.

        `timeout` bounds the wait (seconds; None waits for every case): a process that is exiting must
        not hang on a stuck copy. Matrices not written by then are counted as `unwritten`."""
        if not self._closed:
            self._closed = True
            deadline = None if timeout is None else time.monotonic() + timeout
            with contextlib.suppress(queue.Full):  # the thread is stuck; it is not waited for below
                self._queue.put(None, timeout=timeout)
            self._thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                self.unwritten = self._queue.qsize() + 1  # the one in hand, and the rest
                self._fail(f"closing: {self.unwritten} matrices still unwritten after {timeout:g} s")
            self._write_summary(final=True)
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
            "unwritten": self.unwritten,
            "error": self.error,
            **dict(self.notes),
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
                self._write(item)
            except Exception as e:  # a full disk or a bad case must not reach the model: log once, stop
                self._fail(f"writing a case of {item.layer_name} (width {item.cols}): {type(e).__name__}: {e}")
                self.selection.drop("writer_error")
            finally:
                item.tensors = ()
                with self._lock:
                    self._pending_bytes -= item.staged

    def _write(self, item: _Staged) -> None:
        """The host half of a capture: everything that needed the bounds, then the archive write."""
        matrix, bounds, *rest = self._to_host(item)
        named = dict(zip(item.bound_rows, bounds, strict=True))
        starts, ends = named["starts"].numpy(), named["ends"].numpy()
        cut = len(rest) - len(item.extras)
        reference, extras = rest[:cut], dict(zip(item.extras, (t.numpy() for t in rest[cut:]), strict=True))
        if item.finish is not None:
            ref, more = item.finish(reference[0].numpy() if reference else None, extras, starts, ends)
            reference = [] if ref is None else [torch.from_numpy(ref)]
            item.attrs = {**item.attrs, **more}
        if "attended" in named and (broken := np.nonzero(ends - starts != named["attended"].numpy())[0]).size:
            raise ValueError(f"row {int(broken[0])} attends to a non-contiguous set of columns")
        chunk = dict(item.attrs.get("chunk", {}))
        offsets = named["key_offsets"].numpy() if "key_offsets" in named else None
        if offsets is not None:
            chunk["row_key_offsets"] = runs(offsets)
        requests = (item.requests if item.requests is not None
                    else len(np.unique(starts)) if offsets is None else count_requests(offsets, ends))
        if self.selection.policy.single_request_only and (requests != 1 or starts.any()):
            self.selection.release(item.layer_index, item.cols, item.charged,
                                   decode_rows(item.attrs.get("kind"), int(matrix.shape[0])))
            self.selection.skip("multi_request")
            return
        self._seq += 1
        attrs = {**item.attrs, "chunk": {"requests": requests, **chunk},
                 "capture_policy": self.selection.policy.describe(), "rank": self.rank, "created": utc_now()}
        values = _ragged(matrix, starts, ends)
        if attrs.get("kind") == "decode":  # the decode format: rows from column 0, seq_lens from the ends
            starts, ends, attrs = capture_rows(attrs, starts, ends)
        case = Case.from_rows(f"{self.prefix}-{self._seq:05d}-L{item.layer_index:02d}-w{item.cols}",
                              values, starts, ends, top_k=item.top_k, cols=item.cols,
                              row_stride=item.row_stride, reference_indices=reference[0] if reference else None,
                              attrs=attrs)
        self.selection.settle(item.charged, case.nbytes)
        self.archive.write(case)
        with self._lock:
            self.captured += 1
            self.bytes += case.nbytes
            self.widths.setdefault(item.layer_name, set()).add(item.cols)
        self._write_summary()

    def _to_host(self, item: _Staged) -> list[torch.Tensor]:
        """The staged tensors as host tensors, taken from the item. On CUDA they are copied to pinned memory
        on a side stream behind the model stream's event, and only that stream is waited for; the device
        buffers are released after the copy finished, back to the model stream's pool."""
        tensors, item.tensors = item.tensors, ()
        if item.ready is None:
            return list(tensors)
        device = tensors[0].device
        with torch.cuda.device(device):
            side = self._sides.get(device)
            if side is None:
                side = self._sides[device] = torch.cuda.Stream(device)
            with torch.cuda.stream(side):
                side.wait_event(item.ready)
                host = [_pinned_copy(t) for t in tensors]
            side.synchronize()
        return host

    def _fail(self, message: str) -> None:
        if self.error is None:
            self.error = message
            log.error("logitreplay capture disabled: %s", message)

    def _write_summary(self, final: bool = False) -> None:
        """Replace this writer's summary file. Its own file per writer: root attributes are shared by every
        writer and must not be rewritten. `final` False while the run goes on (a killed process leaves
        the last one written)."""
        target = self.path / f"capture-summary-{self.prefix}.json"
        with self._lock:
            data = {**self.summary(), "final": final, "written": utc_now()}
        try:
            with self._summary_lock:
                if self._final_written:  # a writer thread outliving `close` must not replace it
                    return
                self._final_written = final
                tmp = target.with_name(target.name + ".partial")
                tmp.write_text(json.dumps(data, indent=2) + "\n")
                os.replace(tmp, target)
        except OSError as e:
            self._fail(f"writing summary {target}: {e}")


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def count_requests(key_offsets: np.ndarray, ends: np.ndarray) -> int:
    """Requests among concatenated rows, from each row's key offset (constant within a request) and end
    (non-decreasing within a request, causal rows): a new request where either breaks. Exact unless a
    request with no keys at all sits next to another with the same offset."""
    if key_offsets.size == 0:
        return 0
    breaks = (np.diff(key_offsets) != 0) | (np.diff(ends) < 0)
    return int(breaks.sum()) + 1


def runs(values: np.ndarray, step: int = 0) -> list[list[int]]:
    """Runs of consecutive values that each exceed the one before by `step`, as [first, end, first value]:
    a per-row vector constant within each request (step 0), or a page table's consecutive pages (step 1),
    stored compactly and exactly."""
    if values.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(values.astype(np.int64)) != step) + 1
    firsts = np.concatenate(([0], cuts))
    lasts = np.concatenate((cuts, [values.size]))
    return [[int(a), int(b), int(values[a])] for a, b in zip(firsts, lasts, strict=True)]


def _ragged(matrix: torch.Tensor, starts: np.ndarray, ends: np.ndarray) -> torch.Tensor:
    """Each row's [start, end) of a host matrix, concatenated. A copy per row: on the host that is several
    times faster than gathering every cell by index. Bounds outside the matrix are not checked here: the
    case's validation refuses them before anything is written."""
    rows = [row[s:e] for row, s, e in zip(matrix, starts.tolist(), ends.tolist(), strict=True)]
    return torch.cat(rows) if rows else matrix.new_empty((0,))


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


__all__ = ["CaptureWriter", "DEFAULT_MAX_PENDING", "DEFAULT_MAX_PENDING_BYTES", "Finish", "count_requests", "runs"]
