"""Damaged and forged archives (issue 17, items 1-4, 9, 10): each ends in that case's one-line invalid
result (the other cases replay, `--strict` exits 1 and names every invalid or incomplete case) or in
one-line error for the whole archive: never a traceback, a hang, a huge allocation or a silent pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from tests.plugins import plugin_case

GOOD, BAD = "good", "bad"
ROOT = Path(__file__).resolve().parents[2]


def _make(tmp_path: Path) -> Path:
    root = tmp_path / "a.zarr"
    a = Archive.create(root)
    for cid in (BAD, GOOD):
        a.write(plugin_case(cid))
    return root


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _edit(path: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    doc = _json(path)
    fn(doc)
    path.write_text(json.dumps(doc))


def _attrs(**kv: Any) -> Callable[[Path], None]:
    return lambda r: _edit(r / "cases" / BAD / "zarr.json", lambda d: d["attributes"].update(kv))


def _replay(root: Path, tmp_path: Path, *extra: str) -> tuple[Result, dict[str, Any]]:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(root), "--selectors", "reference", "--json", str(out),
                                    "--strict", *extra])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res, {c["case_id"]: c for c in _json(out)["cases"]} if out.exists() else {}


def _one_line_error(res: Result) -> str:
    assert res.exit_code != 0 and "Traceback" not in res.output, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("Error:"), res.output
    return last


def _one_element_chunks(root: Path) -> None:
    def edit(doc: dict[str, Any]) -> None:
        doc["shape"] = [100000]
        doc["chunk_grid"]["configuration"]["chunk_shape"] = [1]

    _edit(root / "cases" / BAD / "values" / "zarr.json", edit)


ARRAYS = ("values", "offsets", "row_starts", "row_ends")
CASE_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    # item 1: unreadable metadata of every array, an unknown codec, node types that lie
    **{f"{a}/zarr.json is not JSON": ((lambda r, a=a: (r / "cases" / BAD / a / "zarr.json").write_text("{")),
                                      f"field {a}: unreadable array metadata") for a in ARRAYS},
    "unknown codec": ((lambda r: _edit(r / "cases" / BAD / "values" / "zarr.json",
                                       lambda d: d["codecs"][1].update(name="no-such-codec"))),
                      "field values: unreadable array metadata"),
    "array says it is a group": ((lambda r: _edit(r / "cases" / BAD / "offsets" / "zarr.json",
                                                  lambda d: d.update(node_type="group"))), "field offsets"),
    "case group says it is an array": ((lambda r: _edit(r / "cases" / BAD / "zarr.json",
                                                        lambda d: d.update(node_type="array"))), "unreadable"),
    # item 2: a case whose own zarr.json is broken or gone; a case a killed writer left
    "case zarr.json broken": ((lambda r: (r / "cases" / BAD / "zarr.json").write_text("{")), "unreadable"),
    "case zarr.json deleted": ((lambda r: (r / "cases" / BAD / "zarr.json").unlink()), "bad"),
    "killed writer": (_attrs(complete=False), "incomplete"),
    # item 3: attributes that would allocate far more than the data holds
    "top_k 2^30": (_attrs(top_k=2**30), "field top_k: 1073741824 is more than the 64 columns"),
    "cols and row_stride 2^31-1": (_attrs(cols=2**31 - 1, row_stride=2**31 - 1), "GiB"),
    "rows 10^12 for 6 rows": (_attrs(rows=10**12), "field offsets: shape (7,) does not match the case's (1000000000001,)"),
    "valid_elements larger than values": (_attrs(valid_elements=10**9), "field values: shape"),
    # item 4: a metadata document asking for one chunk per element
    "100000 chunks of one element": (lambda r: (_one_element_chunks(r), _attrs(valid_elements=100000)(r)),
                                     "100000 chunks for 100000 elements"),
}


@pytest.mark.parametrize("damage", sorted(CASE_DAMAGE))
def test_damaged_case_is_invalid_the_other_replays_and_strict_names_it(tmp_path: Path, damage: str) -> None:
    root = _make(tmp_path)
    inject, message = CASE_DAMAGE[damage]
    inject(root)
    res, cases = _replay(root, tmp_path)
    assert res.exit_code == 1, res.output
    assert BAD in _one_line_error(res).split("--strict:")[1], res.output
    assert message in cases[BAD]["invalid"], cases[BAD]
    assert cases[GOOD]["invalid"] is None and cases[GOOD]["results"][0]["status"] == "ok"
    # inspect: the same case listed as invalid (or incomplete), no traceback, no claimed shape taken as data
    res = CliRunner().invoke(main, ["inspect", str(root), "--json", "-"])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    listed = {c["case_id"]: c for c in json.loads(res.output[:res.output.rfind("}") + 1])["cases"]}
    assert "values" in listed[GOOD]
    # A damaged case makes inspect exit 1 naming it; one a killed writer left incomplete is listed as
    # such, and is no error; a matrix too wide for this machine is still a well-formed case to inspect.
    if message == "GiB":
        assert res.exit_code == 0 and listed[BAD]["complete"] and not listed[BAD]["invalid"], listed[BAD]
    elif listed[BAD]["invalid"]:
        assert "values" not in listed[BAD] and res.exit_code == 1, (res.exit_code, listed[BAD])
        assert f"1 case invalid: {BAD}" in res.output, res.output[-500:]
    else:
        assert "values" not in listed[BAD] and res.exit_code == 0, (res.exit_code, listed[BAD])
        assert listed[BAD]["complete"] is False, listed[BAD]


@pytest.mark.slow
def test_damaged_case_under_isolate_is_invalid_not_a_dead_child(tmp_path: Path) -> None:
    root = _make(tmp_path)
    (root / "cases" / BAD / "offsets" / "zarr.json").write_text("{")
    res, cases = _replay(root, tmp_path, "--isolate")
    assert res.exit_code == 1 and "unreadable array metadata" in cases[BAD]["invalid"], res.output
    assert cases[GOOD]["results"][0]["status"] == "ok"


@pytest.mark.parametrize(("what", "inject"), [
    ("cases/zarr.json not JSON", lambda r: (r / "cases" / "zarr.json").write_text("{")),
    ("cases says it is an array", lambda r: _edit(r / "cases" / "zarr.json", lambda d: d.update(node_type="array"))),
    ("root zarr.json not JSON", lambda r: (r / "zarr.json").write_text("{")),
])
def test_damaged_archive_level_metadata_is_one_line_error(tmp_path: Path, what: str, inject: Any) -> None:
    root = _make(tmp_path)
    inject(root)
    for cmd in (["replay", str(root), "--selectors", "reference"], ["inspect", str(root)]):
        _one_line_error(CliRunner().invoke(main, cmd))


def test_oversized_attributes_are_refused_by_export_too(tmp_path: Path) -> None:
    root = _make(tmp_path)
    _attrs(cols=2**31 - 1, row_stride=2**31 - 1)(root)
    res = CliRunner().invoke(main, ["export", str(root), "--case", BAD, "--out", str(tmp_path / "x")])
    assert "GiB" in _one_line_error(res)


def test_a_fifo_in_place_of_a_chunk_never_blocks(tmp_path: Path) -> None:
    root = _make(tmp_path)
    chunk = next(p for p in (root / "cases" / BAD / "values" / "c").rglob("*") if p.is_file())
    chunk.unlink()
    os.mkfifo(chunk)
    # In a child process: a read that blocked would hang this test, not fail it.
    run = subprocess.run([sys.executable, "-m", "logitreplay.cli", "replay", str(root), "--selectors", "reference",
                          "--strict"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 1 and "not a regular file" in run.stdout + run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_killed_synth_leaves_a_case_that_replay_names_and_synth_or_repair_complete(tmp_path: Path) -> None:
    out = tmp_path / "s.zarr"
    runner = CliRunner()
    assert runner.invoke(main, ["synth", "--suite", "seed-controls", "--out", str(out)]).exit_code == 0
    first = sorted(p.name for p in (out / "cases").iterdir() if p.is_dir())[0]
    _edit(out / "cases" / first / "zarr.json", lambda d: d["attributes"].pop("complete"))
    res, cases = _replay(out, tmp_path)
    assert f"{first} (incomplete)" in _one_line_error(res) and "repair" in cases[first]["invalid"]
    # synth again rewrites the incomplete case instead of saying it is already there
    res = runner.invoke(main, ["synth", "--suite", "seed-controls", "--out", str(out), "--json", "-"])
    assert res.exit_code == 0 and json.loads(res.output)["written"] == [first], res.output
    assert Archive.open(out).incomplete() == []


def test_repair_completes_a_finished_case_and_removes_a_broken_one(tmp_path: Path) -> None:
    root = _make(tmp_path)
    _attrs(complete=False)(root)  # every array written, the mark missing: completable
    Archive.open(root, mode="a").write(plugin_case("half"))
    _edit(root / "cases" / "half" / "zarr.json", lambda d: d["attributes"].pop("complete"))
    next(p for p in (root / "cases" / "half" / "values" / "c").rglob("*") if p.is_file()).write_bytes(b"x")
    runner = CliRunner()
    res = runner.invoke(main, ["repair", str(root), "--dry-run", "--json", "-"])
    assert res.exit_code == 0, res.output
    plan = {c["case_id"]: c["action"] for c in json.loads(res.output)["cases"]}
    assert plan == {BAD: "complete", "half": "remove"}
    assert sorted(Archive.open(root).incomplete()) == [BAD, "half"]  # a dry run changes nothing
    res = runner.invoke(main, ["repair", str(root)])
    assert res.exit_code == 0 and "1 case completed, 1 removed" in res.output, res.output
    a = Archive.open(root)
    assert a.incomplete() == [] and a.case_ids() == [BAD, GOOD] and a.read(BAD).rows == 6
    assert runner.invoke(main, ["repair", str(root)]).output.strip().endswith("no incomplete or damaged cases")


def test_replaying_one_archive_twice_replays_it_once_and_says_so(tmp_path: Path) -> None:
    root = _make(tmp_path)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(root), str(root), "--selectors", "reference", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = _json(out)
    assert [c["case_id"] for c in doc["cases"]] == [BAD, GOOD]
    assert any("named more than once" in n for n in doc["notes"])


def test_one_case_id_in_two_archives_is_refused(tmp_path: Path) -> None:
    a = _make(tmp_path / "1")
    b = _make(tmp_path / "2")
    res = CliRunner().invoke(main, ["replay", str(a), str(b), "--selectors", "reference"])
    assert "in both" in _one_line_error(res)


def test_url_needing_an_uninstalled_filesystem_is_one_line_error() -> None:
    pytest.importorskip("fsspec")
    if __import__("importlib").util.find_spec("s3fs") is not None:
        pytest.skip("s3fs is installed")
    res = CliRunner().invoke(main, ["inspect", "s3://bucket/x"])
    assert "s3fs" in _one_line_error(res)
