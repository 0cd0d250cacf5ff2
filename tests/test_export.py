"""A case exported to .safetensors loads in two lines as the kernel saw it, and imports back bit for bit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.datasets.export import export_case, read_file


def _case(case_id: str, dtype: torch.dtype = torch.float32, stride: int | None = None, ref: bool = False) -> Case:
    """Rows with nonzero starts, an empty row and a row shorter than k; values with -0.0, inf, subnormals."""
    g = torch.Generator().manual_seed(7)
    rows, cols, k = 6, 40, 8
    logits = torch.randn(rows, cols, generator=g).to(dtype)
    logits[0, :4] = torch.tensor([-0.0, math.inf, -math.inf, 1e-40], dtype=torch.float32).to(dtype)
    starts = torch.tensor([0, 3, 10, 0, 39, 5], dtype=torch.int32)
    ends = torch.tensor([40, 30, 10, 5, 40, 40], dtype=torch.int32)
    reference = torch.randint(-1, 20, (rows, k), generator=g, dtype=torch.int32) if ref else None
    return Case.from_matrix(case_id, logits, starts, ends, top_k=k, row_stride=stride, reference_indices=reference,
                            attrs={"source": "test", "layer": 3, "model": "org/m", "model_revision": "a" * 40})


def _assert_identical(a: Case, b: Case) -> None:
    for name in ("values", "offsets", "row_starts", "row_ends"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes(), name
    assert (a.case_id, a.top_k, a.cols, a.row_stride, a.dtype, a.attrs) == \
        (b.case_id, b.top_k, b.cols, b.row_stride, b.dtype, b.attrs)
    if a.reference_indices is None:
        assert b.reference_indices is None
    else:
        assert b.reference_indices is not None and a.reference_indices.tobytes() == b.reference_indices.tobytes()


@pytest.mark.parametrize("dtype,stride,ref", [(torch.float32, None, False), (torch.bfloat16, None, True),
                                              (torch.float32, 64, True), (torch.bfloat16, 48, False)],
                         ids=["fp32", "bf16-reference", "fp32-strided-reference", "bf16-strided"])
def test_round_trip_is_bit_exact(tmp_path: Path, dtype: torch.dtype, stride: int | None, ref: bool) -> None:
    case = _case("c1", dtype, stride, ref)
    path = export_case(case, tmp_path)
    _assert_identical(case, read_file(path))


def test_file_loads_in_two_lines_as_the_kernel_saw_it(tmp_path: Path) -> None:
    case = _case("strided", torch.bfloat16, stride=64, ref=True)
    path = export_case(case, tmp_path)

    t = load_file(str(path))
    logits, k = t["logits"][:, : t["cols"]], int(t["top_k"])

    assert logits.shape == (case.rows, case.cols) and logits.stride(0) == 64 and logits.dtype == torch.bfloat16
    assert k == case.top_k and t["row_starts"].dtype == torch.int32
    for r in range(case.rows):
        s, e = int(t["row_starts"][r]), int(t["row_ends"][r])
        assert torch.equal(logits[r, s:e].view(torch.int16), case.row(r).view(torch.int16))
        outside = torch.cat([logits[r, :s], logits[r, e:], t["logits"][r, case.cols:]]).float()
        assert bool((outside == -math.inf).all())
    assert torch.equal(t["reference_indices"], torch.from_numpy(case.reference_indices))


def test_fill_value_and_attributes_in_header(tmp_path: Path) -> None:
    case = _case("filled")
    path = export_case(case, tmp_path, fill=12345.0)
    t = load_file(str(path))
    assert float(t["logits"][2, 0]) == 12345.0  # row 2 is empty: every cell is fill
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["logitreplay"])
    assert meta["provenance"] == case.attrs and meta["sha256"] == case.sha256() and meta["fill"] == "12345.0"
    _assert_identical(case, read_file(path))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(0, 5), cols=st.integers(0, 12), pad=st.integers(0, 5), bf16=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_round_trip_any_shape(tmp_path_factory: pytest.TempPathFactory, rows: int, cols: int, pad: int,
                              bf16: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, cols + 1, rows).astype(np.int32)
    ends = (starts + rng.integers(0, cols + 1, rows)).clip(max=cols).astype(np.int32)
    m = torch.from_numpy(rng.standard_normal((rows, cols)).astype(np.float32))
    case = Case.from_matrix("h", m.to(torch.bfloat16) if bf16 else m, starts, ends, top_k=3, row_stride=cols + pad)
    _assert_identical(case, read_file(export_case(case, tmp_path_factory.mktemp("h"))))


def test_import_foreign_file_with_vllm_names(tmp_path: Path) -> None:
    logits = torch.randn(4, 16).to(torch.bfloat16)
    ke = torch.tensor([16, 3, 0, 9], dtype=torch.int64)
    path = tmp_path / "dump.safetensors"
    save_file({"logits": logits, "ke": ke}, str(path), metadata={"engine": "vllm"})
    runner = CliRunner()

    r = runner.invoke(main, ["import", str(path), "--out", str(tmp_path / "a.zarr")])
    assert r.exit_code == 1 and "top_k" in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "a.zarr").exists()

    r = runner.invoke(main, ["import", str(path), "--out", str(tmp_path / "a.zarr"), "--top-k", "2"])
    assert r.exit_code == 0, r.output
    case = Archive.open(tmp_path / "a.zarr").read("dump")
    assert case.dtype == "bfloat16" and case.top_k == 2 and not case.row_starts.any()
    assert case.row_ends.tolist() == [16, 3, 0, 9] and case.attrs["metadata"] == {"engine": "vllm"}
    assert torch.equal(case.row(3).view(torch.int16), logits[3, :9].view(torch.int16))


def test_cli_export_import_round_trip_and_refusals(tmp_path: Path) -> None:
    src = Archive.create(tmp_path / "src.zarr")
    for i, dtype in enumerate((torch.float32, torch.bfloat16)):
        src.write(_case(f"c{i}", dtype, stride=48, ref=True))
    runner = CliRunner()
    out = tmp_path / "files"

    r = runner.invoke(main, ["export", str(tmp_path / "src.zarr"), "--out", str(out), "--case", "c1"])
    assert r.exit_code == 0 and sorted(p.name for p in out.iterdir()) == ["c1.safetensors"]
    r = runner.invoke(main, ["export", str(tmp_path / "src.zarr"), "--out", str(out)])
    assert r.exit_code == 1 and "refusing to overwrite" in r.output  # c1 exists; nothing is clobbered
    r = runner.invoke(main, ["export", str(tmp_path / "src.zarr"), "--out", str(out), "--overwrite", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.output)["files"]) == 2
    r = runner.invoke(main, ["export", str(tmp_path / "src.zarr"), "--out", str(out), "--case", "nope"])
    assert r.exit_code == 1 and r.output.startswith("Error: --case nope: matches none")

    files = sorted(str(p) for p in out.iterdir())
    r = runner.invoke(main, ["import", *files, "--out", str(tmp_path / "back.zarr")])
    assert r.exit_code == 0, r.output
    back = Archive.open(tmp_path / "back.zarr")
    for cid in ("c0", "c1"):
        _assert_identical(src.read(cid), back.read(cid))
    r = runner.invoke(main, ["import", *files, "--out", str(tmp_path / "back.zarr")])
    assert r.exit_code == 1 and "already in" in r.output and back.case_ids() == ["c0", "c1"]


def test_damaged_or_foreign_garbage_is_a_one_line_error(tmp_path: Path) -> None:
    runner = CliRunner()
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    flat = tmp_path / "flat.safetensors"
    save_file({"logits": torch.zeros(8), "row_ends": torch.zeros(8, dtype=torch.int32)}, str(flat))
    good = export_case(_case("d"), tmp_path)
    raw = bytearray(good.read_bytes())
    header_len = int.from_bytes(raw[:8], "little")
    start = 8 + header_len + json.loads(raw[8:8 + header_len])["logits"]["data_offsets"][0]
    raw[start:start + 4] = np.float32(1.0).tobytes()  # logits[0, 0], in range, was -0.0
    damaged = tmp_path / "damaged.safetensors"
    damaged.write_bytes(bytes(raw))
    for path, why in ((junk, "not a readable safetensors"), (flat, "field logits"), (damaged, "sha256")):
        r = runner.invoke(main, ["import", str(path), "--out", str(tmp_path / "x.zarr"), "--top-k", "1"])
        assert r.exit_code == 1 and why in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "x.zarr").exists()  # nothing was readable: no archive was created

    # Files are imported one at a time; a bad file stops the import and says what was already written.
    other = export_case(_case("e"), tmp_path)
    r = runner.invoke(main, ["import", str(other), str(damaged), "--out", str(tmp_path / "y.zarr")])
    assert r.exit_code == 1 and "(1 earlier file imported)" in r.output
    assert Archive.open(tmp_path / "y.zarr").case_ids() == ["e"]


def test_exporting_an_archive_without_a_complete_case_fails(tmp_path: Path) -> None:
    Archive.create(tmp_path / "empty.zarr", {})
    result = CliRunner().invoke(main, ["export", str(tmp_path / "empty.zarr"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "no complete case to export" in result.output
    assert len(result.output.strip().splitlines()) == 1
