"""Archives from strangers: every kind of damage gives a named one-line error, never wrong data, and never
hides the other (healthy) cases of the archive."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.errors import ArchiveError

GOOD, BAD = "good", "bad"


def _make(tmp_path: Path) -> Path:
    root = tmp_path / "a.zarr"
    a = Archive.create(root)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    for cid in (GOOD, BAD):
        a.write(Case.from_matrix(cid, x, np.array([0, 3, 0, 10], np.int32), np.array([64, 40, 0, 11], np.int32),
                                 top_k=8, reference_indices=torch.arange(32, dtype=torch.int32).reshape(4, 8)))
    return root


def _edit_attrs(root: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    meta = root / "cases" / BAD / "zarr.json"
    doc = json.loads(meta.read_text())
    fn(doc["attributes"])
    meta.write_text(json.dumps(doc))


def _edit_array_meta(root: Path, array: str, fn: Callable[[dict[str, Any]], None]) -> None:
    meta = root / "cases" / BAD / array / "zarr.json"
    doc = json.loads(meta.read_text())
    fn(doc)
    meta.write_text(json.dumps(doc))


def _chunk(root: Path, array: str) -> Path:
    return next(p for p in (root / "cases" / BAD / array / "c").rglob("*") if p.is_file())


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 3])


FAULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated values chunk": (lambda r: _truncate(_chunk(r, "values")), "field values: checksum error"),
    "truncated offsets chunk": (lambda r: _truncate(_chunk(r, "offsets")), "field offsets: checksum error"),
    "missing row_ends chunk": (lambda r: _chunk(r, "row_ends").unlink(), "field row_ends: checksum error"),
    "missing reference chunk": (lambda r: _chunk(r, "reference_indices").unlink(),
                                "field reference_indices: checksum error"),
    "missing values array": (lambda r: __import__("shutil").rmtree(r / "cases" / BAD / "values"),
                             "field values: array missing"),
    "complete not true": (lambda r: _edit_attrs(r, lambda a: a.update(complete="yes")), "incomplete"),
    "unknown case schema": (lambda r: _edit_attrs(r, lambda a: a.update(schema_version=7)),
                            "field schema_version: 7 is not supported"),
    "top_k zero": (lambda r: _edit_attrs(r, lambda a: a.update(top_k=0)), "field top_k: must be an integer"),
    "top_k negative": (lambda r: _edit_attrs(r, lambda a: a.update(top_k=-5)), "field top_k"),
    "top_k a string": (lambda r: _edit_attrs(r, lambda a: a.update(top_k="8")), "field top_k: expected an integer"),
    "cols beyond 2^31": (lambda r: _edit_attrs(r, lambda a: a.update(cols=2**40, row_stride=2**40)), "field cols"),
    "end beyond cols": (lambda r: _edit_attrs(r, lambda a: a.update(cols=50, row_stride=64)),
                        "field row_ends: row 0 violates"),
    "stride below cols": (lambda r: _edit_attrs(r, lambda a: a.update(row_stride=10)), "field row_stride"),
    "unknown dtype": (lambda r: _edit_attrs(r, lambda a: a.update(dtype="float8")), "field dtype: 'float8'"),
    "checksums not an object": (lambda r: _edit_attrs(r, lambda a: a.update(checksums=[1, 2])),
                                "field checksums: not a JSON object"),
    "provenance not an object": (lambda r: _edit_attrs(r, lambda a: a.update(provenance="x")),
                                 "field provenance: not a JSON object"),
    "checksum of values replaced": (lambda r: _edit_attrs(r, lambda a: a["checksums"].update(values="0" * 64)),
                                    "field values: checksum error"),
    "values stored as float64": (lambda r: _edit_array_meta(r, "values", lambda d: d.update(data_type="float64")),
                                 "field values"),
    "metadata not JSON": (lambda r: (r / "cases" / BAD / "zarr.json").write_text("{not json"),
                          "unreadable metadata"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_damaged_case_is_a_named_error_and_other_cases_still_read(tmp_path: Path, fault: str) -> None:
    root = _make(tmp_path)
    inject, message = FAULTS[fault]
    inject(root)
    archive = Archive.open(root)
    with pytest.raises(ArchiveError, match=rf"case {BAD}: .*{message}"):
        archive.read(BAD)
    good = archive.read(GOOD)
    assert good.rows == 4
    # The CLI lists the case as invalid with the same reason and ends in a one-line error with a
    # non-zero exit, never a traceback.
    res = CliRunner().invoke(main, ["inspect", str(root), "--case", BAD, "--json", "-"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    if BAD in archive.case_ids():
        assert res.exit_code == 1, res.output
        assert res.output.strip().splitlines()[-1] == f"Error: 1 case invalid: {BAD} (listed above)"
        listed = json.loads(res.output[:res.output.rindex("Error:")])["cases"][0]
        assert re.search(message, listed["invalid"]), listed


def test_zip_with_escaping_entries_is_read_in_place_without_extracting(tmp_path: Path) -> None:
    root = _make(tmp_path)
    z = Archive.open(root).pack(tmp_path / "a.zip")
    with zipfile.ZipFile(z, "a") as zf:
        zf.writestr("../../escaped.txt", "x")
        zf.writestr("/abs/escaped.txt", "x")
    archive = Archive.open(z)
    assert archive.case_ids() == [BAD, GOOD]
    archive.read(GOOD)
    assert not (tmp_path.parent / "escaped.txt").exists() and not Path("/abs/escaped.txt").exists()


@pytest.mark.parametrize("content", [b"", b"PK\x03\x04garbage", b"not a zip at all"])
def test_damaged_zip_is_one_line_error(tmp_path: Path, content: bytes) -> None:
    z = tmp_path / "d.zip"
    z.write_bytes(content)
    with pytest.raises(ArchiveError, match=r"d\.zip"):
        Archive.open(z)


def test_root_attributes_that_are_not_our_object(tmp_path: Path) -> None:
    root = _make(tmp_path)
    meta = root / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["logitreplay"] = "v1"
    meta.write_text(json.dumps(doc))
    with pytest.raises(ArchiveError, match="not a logitreplay archive"):
        Archive.open(root)


def test_symlinked_chunk_pointing_elsewhere_fails_its_checksum(tmp_path: Path) -> None:
    root = _make(tmp_path)
    chunk = _chunk(root, "values")
    outside = tmp_path / "outside.bin"
    outside.write_bytes(_chunk(root, "offsets").read_bytes())
    chunk.unlink()
    chunk.symlink_to(outside)
    with pytest.raises(ArchiveError, match=f"case {BAD}: field values: checksum error"):
        Archive.open(root).read(BAD)
