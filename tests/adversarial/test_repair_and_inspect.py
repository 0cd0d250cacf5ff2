"""Issue 40, finding 6: `repair` is never silent about a complete case that fails its checksums (it says
so case by case, leaves it unless asked, and exits 1), says what it did or would do in plain words, and
`inspect` counts every row of its table once and names the rows that are not data by their whole ids."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
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
