"""The archive is the one format every stage shares: what is written must read back bit-identical, and
damage must be reported as such, never read as data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logitreplay.archive import Archive, Case
from logitreplay.errors import ArchiveError


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Any valid case: float32 or bfloat16, lengths around k (0, 1, k-1, k, k+1), starts, padded strides."""
    top_k = draw(st.integers(1, 12))
    cols = draw(st.integers(0, 40))
    rows = draw(st.integers(0, 8))
    starts, ends = [], []
    for _ in range(rows):
        length = draw(st.sampled_from([0, 1, top_k - 1, top_k, top_k + 1, cols]))
        length = max(0, min(length, cols))
        start = draw(st.integers(0, cols - length))
        starts.append(start)
        ends.append(start + length)
    stride = cols + draw(st.sampled_from([0, 0, 3, 256]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    seed = draw(st.integers(0, 2**16))
    logits = torch.randn(rows, max(stride, 1), generator=torch.Generator().manual_seed(seed)).to(dtype)[:, :cols]
    ref = None
    if draw(st.booleans()):
        ref = torch.randint(-1, max(cols, 1), (rows, top_k), dtype=torch.int32)
    attrs = {"model": "tiny", "layer_index": draw(st.integers(0, 60)), "nested": {"ok": [1, 2.5, None]}}
    return Case.from_matrix("c", logits, np.array(starts, np.int32), np.array(ends, np.int32), top_k=top_k,
                            row_stride=stride, reference_indices=ref, attrs=attrs)


def assert_same(a: Case, b: Case) -> None:
    assert (a.case_id, a.top_k, a.cols, a.row_stride, a.dtype, a.attrs) == \
        (b.case_id, b.top_k, b.cols, b.row_stride, b.dtype, b.attrs)
    for name in ("values", "offsets", "row_starts", "row_ends"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    if a.reference_indices is None:
        assert b.reference_indices is None
    else:
        assert b.reference_indices is not None
        assert np.array_equal(a.reference_indices, b.reference_indices)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_any_valid_case_round_trips_bit_identical(tmp_path_factory: pytest.TempPathFactory, case: Case) -> None:
    path = tmp_path_factory.mktemp("a") / "a.zarr"
    Archive.create(path).write(case)
    back = Archive.open(path).read("c")
    assert_same(case, back)
    # The rebuilt matrix holds the values in range and poison everywhere else, with the recorded stride.
    m = back.padded(poison=7.0)
    assert m.stride() == (case.row_stride, 1) or case.rows <= 1
    for r in range(case.rows):
        s, e = int(case.row_starts[r]), int(case.row_ends[r])
        assert torch.equal(m[r, s:e], case.row(r))
        assert bool((m[r, :s] == 7.0).all()) and bool((m[r, e:] == 7.0).all())


def test_zip_pack_reads_back_the_same(tmp_path: Path, small_case: Case) -> None:
    a = Archive.create(tmp_path / "a.zarr")
    a.write(small_case)
    z = Archive.open(a.pack(tmp_path / "a.zip"))
    assert z.case_ids() == [small_case.case_id]
    assert_same(small_case, z.read(small_case.case_id))
    assert not (tmp_path / "a.zip.partial").exists()


@pytest.fixture
def small_case() -> Case:
    x = torch.randn(6, 300, generator=torch.Generator().manual_seed(0))
    starts = np.array([0, 5, 0, 10, 0, 0], np.int32)
    ends = np.array([300, 5, 1, 20, 299, 250], np.int32)
    return Case.from_matrix("case-0", x, starts, ends, top_k=8, attrs={"source": "test"})


def _chunk_files(root: Path, case_id: str, array: str) -> list[Path]:
    return sorted(p for p in (root / "cases" / case_id / array).rglob("*") if p.is_file() and p.name != "zarr.json")


@pytest.mark.parametrize("array", ["values", "offsets", "row_starts", "row_ends"])
def test_flipped_byte_is_a_checksum_error_naming_the_case(tmp_path: Path, small_case: Case, array: str) -> None:
    root = tmp_path / "a.zarr"
    Archive.create(root).write(small_case)
    chunk = _chunk_files(root, "case-0", array)[0]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x40
    chunk.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match=rf"case case-0: field {array}: checksum error"):
        Archive.open(root).read("case-0")


def test_missing_chunk_is_reported_not_read_as_zeros(tmp_path: Path, small_case: Case) -> None:
    root = tmp_path / "a.zarr"
    Archive.create(root).write(small_case)
    _chunk_files(root, "case-0", "values")[0].unlink()
    with pytest.raises(ArchiveError, match="case case-0: field values: checksum error"):
        Archive.open(root).read("case-0")


def test_case_without_complete_is_listed_as_incomplete_and_never_read(tmp_path: Path, small_case: Case) -> None:
    root = tmp_path / "a.zarr"
    a = Archive.create(root)
    a.write(small_case)
    meta = root / "cases" / "case-0" / "zarr.json"
    doc = json.loads(meta.read_text())
    del doc["attributes"]["complete"]
    meta.write_text(json.dumps(doc))
    b = Archive.open(root)
    assert b.case_ids() == [] and b.incomplete() == ["case-0"]
    assert list(b) == []
    with pytest.raises(ArchiveError, match="case case-0: incomplete"):
        b.read("case-0")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("row_ends", np.array([5, 3], np.int32), "row_ends: row 1 violates 0 <= start <= end <= cols"),
    ("row_ends", np.array([5, 11], np.int32), "row_ends: row 1 violates"),
    ("row_starts", np.array([-1, 4], np.int32), "row_starts: row 0 violates"),
    ("top_k", 0, "top_k: must be an integer"),
    ("dtype", "float16", "dtype: 'float16' is not one of"),
    ("offsets", np.array([0, 5, 8], np.int64), "offsets: inconsistent with row bounds"),
    ("values", np.zeros(3, np.float64), "values: expected 1-D float32"),
    ("row_stride", 5, "row_stride: must be in"),
    ("attrs", {"x": object()}, "attrs: not a JSON object"),
])
def test_invalid_case_names_case_and_field(field: str, value: object, message: str) -> None:
    x = torch.arange(20, dtype=torch.float32).reshape(2, 10)
    case = Case.from_matrix("bad", x, np.array([0, 4], np.int32), np.array([5, 10], np.int32), top_k=2)
    setattr(case, field, value)
    with pytest.raises(ArchiveError, match=rf"^case bad: field {message}"):
        case.validate()


def test_unknown_schema_version_is_refused(tmp_path: Path, small_case: Case) -> None:
    root = tmp_path / "a.zarr"
    Archive.create(root).write(small_case)
    meta = root / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["logitreplay"]["schema_version"] = 99
    meta.write_text(json.dumps(doc))
    with pytest.raises(ArchiveError, match="schema version 99 is not supported"):
        Archive.open(root)


def test_writing_never_clobbers_an_existing_case_or_a_foreign_directory(tmp_path: Path, small_case: Case) -> None:
    a = Archive.create(tmp_path / "a.zarr")
    a.write(small_case)
    with pytest.raises(ArchiveError, match="already in"):
        a.write(small_case)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("keep")
    with pytest.raises(ArchiveError, match="not an archive; refusing"):
        Archive.create(tmp_path / "other")
    assert (tmp_path / "other" / "precious.txt").read_text() == "keep"


def test_causal_case_stores_about_half_of_its_padded_matrix(tmp_path: Path) -> None:
    from logitreplay.datasets import synth

    recipe = next(r for r in synth.recipes("seed-controls", "small") if r.group == "b" and r.distribution == "normal")
    a = Archive.create(tmp_path / "a.zarr")
    a.write(synth.generate(recipe))
    info = a.infos()[0]
    padded = recipe.rows * recipe.cols * 4
    assert info.stored_bytes is not None
    assert 0.4 < info.stored_bytes / padded < 0.55


def test_a_second_creator_waits_for_an_archive_another_process_is_creating(tmp_path: Path) -> None:
    """TP ranks start capturing together: one rank must not open the archive between the root's metadata
    and its 'cases' group, which another rank's creation writes one after the other."""
    import threading
    import time

    import zarr

    from logitreplay.archive.guards import writer_lock
    from logitreplay.archive.store import SCHEMA_VERSION

    path = tmp_path / "cap.zarr"
    begun = threading.Event()

    def first_creator() -> None:
        with writer_lock(path, wait=True):
            root = zarr.open_group(str(path), mode="a", zarr_format=3)
            begun.set()
            time.sleep(0.3)  # the second creator arrives before the attributes and the 'cases' group
            root.attrs.update({"logitreplay": {"schema_version": SCHEMA_VERSION, "created": "now"}})
            root.require_group("cases")

    thread = threading.Thread(target=first_creator)
    thread.start()
    begun.wait()
    archive = Archive.create(path)
    thread.join()
    assert archive.case_ids() == []
