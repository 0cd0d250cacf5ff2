"""Capture writer: cases land complete and exact, drops are counted instead of blocking, errors never
escape into the model, the run summary is its own file, and a killed capture leaves readable cases."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from logitreplay.archive import Archive
from logitreplay.capture.policy import Policy, PolicyState
from logitreplay.capture.writer import CaptureWriter


def _matrix(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, cols, generator=g)
    starts = torch.randint(0, cols // 2, (rows,), generator=g)
    ends = starts + torch.randint(0, cols // 2 + 1, (rows,), generator=g)
    return logits, starts, ends


def _submit(writer: CaptureWriter, logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
            layer: int = 0, requests: int | None = 2) -> bool:
    ref = torch.full((logits.shape[0], 4), -1, dtype=torch.int32)
    return writer.submit(logits, starts, ends, ref, top_k=4, row_stride=logits.shape[1], layer_index=layer,
                         layer_name=f"layers.{layer}.indexer", requests=requests, attrs={"model": "unit"})


def _hold(writer: CaptureWriter) -> threading.Event:
    """Keep the writer thread off the staged matrices until the returned event is set."""
    release = threading.Event()
    to_host = writer._to_host

    def held(item):  # type: ignore[no-untyped-def]
        release.wait(30)
        return to_host(item)

    writer._to_host = held  # type: ignore[method-assign]
    return release


def test_cases_are_written_exactly_with_provenance_and_summary(tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    writer = CaptureWriter(out, PolicyState(Policy.parse("every")), rank=3)
    root_before = (out / "zarr.json").read_text()
    logits, starts, ends = _matrix(8, 64)
    assert _submit(writer, logits, starts, ends)
    second = _matrix(4, 32, seed=1)
    assert _submit(writer, *second, layer=1)
    summary = writer.close()

    archive = Archive.open(out)
    assert len(archive.case_ids()) == 2 and not archive.incomplete()
    case = archive.read(archive.case_ids()[0])
    assert case.case_id.startswith(f"r3-p{os.getpid()}-")
    assert case.cols == 64 and case.row_stride == 64 and case.top_k == 4
    for r in range(8):
        assert torch.equal(case.row(r), logits[r, int(starts[r]):int(ends[r])])
    assert case.attrs["model"] == "unit" and case.attrs["rank"] == 3
    assert case.attrs["capture_policy"]["mode"] == "every_call" and "created" in case.attrs

    assert (out / "zarr.json").read_text() == root_before  # shared root attributes never rewritten
    on_disk = json.loads((out / f"capture-summary-{writer.prefix}.json").read_text())
    assert on_disk["captured"] == summary["captured"] == 2
    assert on_disk["bytes"] == 4 * int((ends - starts).sum() + (second[2] - second[1]).sum())
    assert on_disk["widths"] == {"layers.0.indexer": [64], "layers.1.indexer": [32]}
    assert on_disk["dropped"] == {} and on_disk["error"] is None
    assert writer.selection.nbytes == on_disk["bytes"]  # charged the whole matrix, settled to the exact size
    assert case.attrs["chunk"] == {"requests": 2}


def test_the_model_may_overwrite_its_buffer_right_after_submit(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every")))
    logits, starts, ends = _matrix(16, 64)
    kept = logits.clone()
    assert _submit(writer, logits, starts, ends)
    logits.fill_(float("nan"))  # the next layer reuses the buffer before the writer has run
    writer.close()
    case = next(iter(Archive.open(tmp_path / "cap.zarr")))
    for r in range(16):
        assert torch.equal(case.row(r), kept[r, int(starts[r]):int(ends[r])])


def test_byte_budget_is_charged_by_the_whole_matrix_until_the_writer_knows(tmp_path: Path) -> None:
    """Admission sees only shapes: a matrix whose in-range cells would fit, but whose (rows, cols) does
    not, is dropped; what is kept is charged its exact in-range size once written."""
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every,max-bytes=1024")))
    release = _hold(writer)
    narrow = (torch.zeros(4, dtype=torch.int64), torch.full((4,), 8))
    assert not _submit(writer, torch.randn(4, 128), *narrow)  # 128 in-range bytes, 2048 charged
    assert _submit(writer, torch.randn(4, 64), *narrow)  # 1024 charged
    assert not _submit(writer, torch.randn(4, 8), *narrow)  # the budget is spent until settled
    release.set()
    summary = writer.close()
    assert summary["bytes"] == writer.selection.nbytes == 128
    assert summary["dropped"] == {"over_byte_budget": 2}


def test_a_decode_call_takes_and_frees_its_decode_key(tmp_path: Path) -> None:
    """The writer records a decode call under the policy's decode key (layer, rows bucket, width bucket),
    not the prefill (layer, width), and frees that key when the host finds the matrix ineligible."""
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("single-request")))
    release = _hold(writer)
    ref = torch.full((4, 4), -1, dtype=torch.int32)
    staged = writer.submit(torch.randn(4, 16), torch.tensor([0, 0, 3, 3]), torch.full((4,), 16), ref, top_k=4,
                           row_stride=16, layer_index=0, layer_name="layers.0.indexer", requests=1,
                           attrs={"model": "unit", "kind": "decode"})
    assert staged and not writer.selection.wants(0, 16, decode_rows=3) and writer.selection.wants(0, 16)
    release.set()
    deadline = time.monotonic() + 10
    while not writer.selection.skipped.get("multi_request") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.selection.wants(0, 16, decode_rows=3) and writer.selection.cases == 0  # released
    assert writer.close()["error"] is None


def test_single_request_is_decided_on_the_host_and_frees_the_shape(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("single-request")))
    logits = torch.randn(4, 16)
    assert not _submit(writer, logits, torch.zeros(4, dtype=torch.int64), torch.full((4,), 16), requests=2)
    assert writer.selection.skipped == {"multi_request": 1}  # the batch shape says so: refused at once
    padded = (torch.tensor([0, 0, 3, 3]), torch.full((4,), 16))  # one request, but a row starts past 0
    assert _submit(writer, logits, *padded, requests=1)  # only the writer can tell
    deadline = time.monotonic() + 10
    while writer.selection.skipped.get("multi_request", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer.selection.cases == 0 and writer.selection.nbytes == 0  # released
    assert _submit(writer, logits, torch.zeros(4, dtype=torch.int64), torch.full((4,), 16), requests=None)
    summary = writer.close()
    assert summary["captured"] == 1 and summary["skipped"] == {"multi_request": 2} and summary["dropped"] == {}
    assert next(iter(Archive.open(tmp_path / "cap.zarr"))).attrs["chunk"] == {"requests": 1}


def test_bounds_that_do_not_describe_a_row_fail_the_writer_once(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every")))
    logits, starts, ends = torch.randn(3, 8), torch.tensor([0, 2, 0]), torch.tensor([4, 6, 8])
    attended = torch.tensor([4, 3, 8])  # row 1 attended 3 columns spread over [2, 6): not one range
    with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
        assert writer.submit(logits, starts, ends, None, top_k=2, row_stride=8, layer_index=0, layer_name="x",
                             requests=1, attrs={}, attended=attended)
        summary = writer.close()
    assert "row 1 attends to a non-contiguous set of columns" in summary["error"]
    assert summary["captured"] == 0 and summary["dropped"] == {"writer_error": 1}
    assert len([r for r in caplog.records if "capture disabled" in r.getMessage()]) == 1
    with pytest.raises(ValueError, match="ends of shape"):
        writer.submit(logits, starts, ends[:2], None, top_k=2, row_stride=8, layer_index=0, layer_name="x",
                      requests=1, attrs={})


def test_full_queue_drops_and_counts_without_blocking(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every")), max_pending=1)
    entered, release = threading.Event(), threading.Event()
    real_write = writer.archive.write

    def slow_write(case, overwrite=False):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(10)
        real_write(case, overwrite)

    writer.archive.write = slow_write  # type: ignore[method-assign]
    m = _matrix(4, 16)
    assert _submit(writer, *m)  # taken by the writer thread, which now blocks in write
    assert entered.wait(10)
    assert _submit(writer, *m)  # waits in the queue (capacity 1)
    t0 = time.perf_counter()
    assert not _submit(writer, *m)  # queue full: dropped at once
    assert time.perf_counter() - t0 < 5
    release.set()
    summary = writer.close()
    assert summary["captured"] == 2 and summary["dropped"] == {"queue_full": 1}


def test_pending_byte_limit_drops(tmp_path: Path) -> None:
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every")), max_pending_bytes=16)
    logits = torch.randn(2, 64)
    assert not _submit(writer, logits, torch.tensor([0, 0]), torch.tensor([64, 64]))
    assert writer.close()["dropped"] == {"queue_full": 1}


def test_write_error_is_logged_once_and_turns_capture_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every")))

    def full_disk(case, overwrite=False):  # type: ignore[no-untyped-def]
        raise OSError(28, "No space left on device")

    writer.archive.write = full_disk  # type: ignore[method-assign]
    m = _matrix(4, 16)
    with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
        assert _submit(writer, *m)
        deadline = time.monotonic() + 10
        while not writer.failed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _submit(writer, *m)  # the writer is off: later matrices are dropped, nothing raises
        summary = writer.close()
    assert "No space left on device" in summary["error"]
    assert summary["captured"] == 0 and summary["dropped"] == {"writer_error": 1, "writer_off": 1}
    assert len([r for r in caplog.records if "capture disabled" in r.getMessage()]) == 1


def test_writer_refuses_a_directory_that_is_not_an_archive(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="not an archive"):
        CaptureWriter(tmp_path, PolicyState(Policy()))


_CHILD = textwrap.dedent("""
    import sys, time, torch
    from logitreplay.capture.policy import Policy, PolicyState
    from logitreplay.capture.writer import CaptureWriter
    writer = CaptureWriter(sys.argv[1], PolicyState(Policy.parse("every")))
    logits = torch.randn(512, 2048)
    starts = torch.zeros(512, dtype=torch.int64)
    ends = torch.full((512,), 2048)
    ref = torch.zeros(512, 8, dtype=torch.int32)
    i = 0
    while True:
        writer.submit(logits + i, starts, ends, ref, top_k=8, row_stride=2048, layer_index=i % 3,
                      layer_name="x", requests=1, attrs={})
        i += 1
        print(writer.captured, flush=True)
        time.sleep(0.002)
""")


def test_killed_capture_leaves_every_completed_case_readable(tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if int(line) >= 3:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    archive = Archive.open(out)
    ids = archive.case_ids()
    assert len(ids) >= 3
    for cid in ids:  # complete means every array is there and its checksum matches
        case = archive.read(cid)
        assert case.rows == 512 and np.isfinite(case.values).all()
    assert set(archive.incomplete()).isdisjoint(ids)


def test_writers_appending_to_one_archive_never_collide(tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    for _ in range(2):  # e.g. two runs of one script, or a restarted server whose worker got the same pid
        writer = CaptureWriter(out, PolicyState(Policy.parse("every")))
        assert _submit(writer, *_matrix(4, 16))
        assert writer.close()["error"] is None
    assert len(Archive.open(out).case_ids()) == 2
    assert len(list(out.glob("capture-summary-*.json"))) == 2


_RANK = textwrap.dedent("""
    import sys, torch
    from logitreplay.capture.policy import Policy, PolicyState
    from logitreplay.capture.writer import CaptureWriter
    writer = CaptureWriter(sys.argv[1], PolicyState(Policy.parse("every")), rank=int(sys.argv[2]))
    logits, starts, ends = torch.randn(4, 16), torch.zeros(4, dtype=torch.int64), torch.full((4,), 16)
    writer.submit(logits, starts, ends, None, top_k=4, row_stride=16, layer_index=0, layer_name="x",
                  requests=1, attrs={})
    assert writer.close()["error"] is None
""")


def test_ranks_creating_one_archive_at_once_all_write(tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(out), str(rank)]) for rank in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    ids = Archive.open(out).case_ids()
    assert sorted(cid.split("-")[0] for cid in ids) == ["r0", "r1", "r2"]
