"""Issue 40, finding 6: `repair` is never silent about a complete case that fails its checksums (it says
so case by case, leaves it unless asked, and exits 1), says what it did or would do in plain words, and
`inspect` counts every row of its table once and names the rows that are not data by their whole ids."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from tests.plugins import plugin_case

DAMAGED, COMPLETABLE, BROKEN, GOOD = "a-damaged-c64", "b-half-c64", "b-half-c64-x", "c-good-c64"


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    root = tmp_path / "a.zarr"
    a = Archive.create(root)
    for cid in (DAMAGED, COMPLETABLE, BROKEN, GOOD):
        a.write(plugin_case(cid))
    chunk = next(p for p in (root / "cases" / DAMAGED / "values" / "c").rglob("*") if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    for cid in (COMPLETABLE, BROKEN):  # killed writers: the mark missing, and an array too
        meta = root / "cases" / cid / "zarr.json"
        doc = json.loads(meta.read_text())
        del doc["attributes"]["complete"]
        meta.write_text(json.dumps(doc))
    shutil.rmtree(root / "cases" / BROKEN / "offsets")
    return root


def _cli(*args: str) -> Result:
    res = CliRunner().invoke(main, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def test_repair_reports_a_damaged_complete_case_and_exits_1(archive: Path) -> None:
    res = _cli("repair", str(archive), "--dry-run")
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert lines[-2] == f"{archive}: 1 case would be completed, 1 would be removed, 1 damaged (dry run)"
    assert lines[-1] == (f"Error: 1 complete case damaged, left as it is: {DAMAGED} (replay reports it invalid; "
                         "--remove-damaged removes it)")
    assert f"would leave as it is {DAMAGED}: damaged: field values: checksum error" in res.output
    assert sorted(Archive.open(archive).incomplete()) == [COMPLETABLE, BROKEN]  # a dry run changes nothing

    res = _cli("repair", str(archive), "--json", "-")
    assert res.exit_code == 1
    actions = {c["case_id"]: c["action"] for c in json.loads(res.output[:res.output.rindex("Error:")])["cases"]}
    assert actions == {DAMAGED: "damaged", COMPLETABLE: "complete", BROKEN: "remove"}
    a = Archive.open(archive)
    assert a.case_ids() == [DAMAGED, COMPLETABLE, GOOD] and a.incomplete() == []  # the damaged case is kept

    res = _cli("repair", str(archive), "--remove-damaged")
    assert res.exit_code == 0 and res.output.splitlines()[-1] == f"{archive}: 1 case removed", res.output
    assert Archive.open(archive).case_ids() == [COMPLETABLE, GOOD]
    assert _cli("repair", str(archive)).output.strip().endswith("no incomplete or damaged cases")


def test_inspect_counts_every_row_once_and_names_unusable_rows_whole(archive: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(archive.parent)
    res = _cli("inspect", archive.name)
    assert res.exit_code == 1
    lines = res.output.splitlines()
    assert lines[0] == f"{archive.name}: 4 cases: 1 readable, 1 invalid, 2 incomplete"
    table = "".join(lines[1:])
    for cid in (DAMAGED, COMPLETABLE, BROKEN):  # whole ids, however the column folds them
        assert cid in table.replace(" ", "") or cid in res.output
    assert f"invalid: {DAMAGED}: field values: checksum error" in res.output
    assert f"incomplete: {COMPLETABLE}: its writer did not finish" in res.output
    assert f"incomplete: {BROKEN}: its writer did not finish" in res.output
    assert lines[-1] == f"Error: 1 case invalid: {DAMAGED} (listed above)"


def _edit(root: Path, rel: str, fn: Callable[[dict[str, Any]], None]) -> None:
    meta = root / rel / "zarr.json"
    doc = json.loads(meta.read_text())
    fn(doc)
    meta.write_text(json.dumps(doc))


# Malformed cases (in a case named `bad` beside a good one): what is wrong, and the words that name it.
MALFORMED: dict[str, tuple[Callable[[Path], None], str]] = {
    "values array missing": (lambda r: shutil.rmtree(r / "cases/bad/values"), "field values: array missing"),
    "values stored as int32": (lambda r: _edit(r, "cases/bad/values", lambda d: d.update(data_type="int32")),
                               "field values: stored as int32"),
    "row_ends of another shape": (lambda r: _edit(r, "cases/bad/row_ends", lambda d: d.update(shape=[3])),
                                  "field row_ends: shape (3,) does not match"),
    "rows out of bounds": (lambda r: _edit(r, "cases/bad", lambda d: d["attributes"].update(cols=10, row_stride=10)),
                           "field row_ends: row 0 violates"),
    "chunk of zero bytes": (lambda r: next((r / "cases/bad/values/c").rglob("0")).write_bytes(b""),
                            "field values: checksum error"),
    "codecs that lie": (lambda r: _edit(r, "cases/bad/values", lambda d: d.update(codecs=[{"name": "bytes"}])),
                        "field values: checksum error"),
}


@pytest.mark.parametrize("fault", sorted(MALFORMED))
def test_export_and_repair_name_a_malformed_case_and_keep_the_others(tmp_path: Path, fault: str) -> None:
    root = tmp_path / "m.zarr"
    a = Archive.create(root)
    a.write(plugin_case("bad"))
    a.write(plugin_case("good"))
    inject, words = MALFORMED[fault]
    inject(root)
    res = _cli("export", str(root), "--out", str(tmp_path / "st"))
    assert res.exit_code == 1 and res.output.splitlines()[-1].startswith("Error: 1 case not exported (damaged): bad: ")
    assert words in res.output and [p.name for p in (tmp_path / "st").iterdir()] == ["good.safetensors"]
    res = _cli("repair", str(root), "--dry-run")
    assert res.exit_code == 1 and words in res.output
    assert res.output.splitlines()[-1].startswith("Error: 1 complete case damaged, left as it is: bad ")


def test_inspect_says_which_case_holds_a_nan_that_replay_refuses(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    a = Archive.create(tmp_path / "n.zarr")
    a.write(plugin_case("bad", nan_row=2))
    a.write(plugin_case("good"))
    res = _cli("inspect", "n.zarr")
    assert res.exit_code == 0, res.output
    assert "NaN: bad: a NaN inside row 2 (replay reports the case invalid input and never times it)" in " ".join(
        res.output.split())
    doc = json.loads(_cli("inspect", "n.zarr", "--json", "-").output)  # NaN is not JSON: counted, not a min
    assert [c["nan_row"] for c in doc["cases"]] == [2, None]
    assert doc["cases"][0]["values"]["nan"] == 1 and doc["cases"][0]["values"]["min"] == -3.0


def test_inspect_json_of_infinite_logits_is_json(tmp_path: Path) -> None:
    values = np.linspace(-1, 1, 64, dtype=np.float32)
    values[[3, 5]] = [np.inf, -np.inf]
    a = Archive.create(tmp_path / "i.zarr")
    a.write(Case.from_rows("inf", values, np.array([0], np.int32), np.array([64], np.int32), top_k=8, cols=64))
    res = _cli("inspect", str(tmp_path / "i.zarr"), "--json", "-")
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)["cases"][0]["values"]
    assert (stats["min"], stats["max"]) == ("-inf", "inf")
    assert "-inf / inf" in _cli("inspect", str(tmp_path / "i.zarr"), "--wide").output
