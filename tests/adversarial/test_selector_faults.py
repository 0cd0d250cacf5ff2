"""Foreign selectors that hang, crash, or return nonsense cost only their own results; with --isolate a
hang is cut by the per-case timeout and a dead process is replaced for the next case."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from logitreplay.archive import Archive
from logitreplay.cli import main
from tests.plugins import plugin_case

FAULTY = "tests.adversarial.faulty_plugins"


def _archive(tmp_path: Path, n: int) -> Path:
    a = Archive.create(tmp_path / "p.zarr")
    for i in range(n):
        a.write(plugin_case(f"p{i}"))
    return tmp_path / "p.zarr"


def _statuses(json_path: Path) -> dict[str, list[tuple[str, str | None]]]:
    doc = json.loads(json_path.read_text())
    out: dict[str, list[tuple[str, str | None]]] = {}
    for case in doc["cases"]:
        for r in case["results"]:
            out.setdefault(r["selector"], []).append((r["status"], r["reason"]))
    return out


def test_isolated_hang_and_segfault_lose_only_their_own_results(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, [
        "replay", str(_archive(tmp_path, 2)), "--selectors", "reference,native",
        "--selector", f"{FAULTY}:make_segfault", "--selector", f"{FAULTY}:make_hang",
        "--timeout", "3", "--json", str(out)])
    assert res.exit_code == 0, res.output
    st = _statuses(out)
    assert [s for s, _ in st["reference"]] == ["ok", "ok"] and [s for s, _ in st["native"]] == ["ok", "ok"]
    # Killed on both cases: a new worker started for the second case after the first one died.
    assert all(s == "error" and "worker died: SIGSEGV" in (why or "") for s, why in st["segfault"])
    assert len(st["segfault"]) == 2
    assert all(s == "error" and "timed out after 3 s" in (why or "") for s, why in st["hang"])


def test_nonsense_launches_are_reported_and_good_selectors_still_time(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, [
        "replay", str(_archive(tmp_path, 1)), "--selectors", "reference",
        "--selector", f"{FAULTY}:make_not_a_launch", "--selector", f"{FAULTY}:make_wrong_shape",
        "--selector", f"{FAULTY}:make_wrong_dtype", "--json", str(out)])
    assert res.exit_code == 0, res.output
    st = _statuses(out)
    assert st["reference"][0][0] == "ok"
    assert st["not-a-launch"][0] == ("error", st["not-a-launch"][0][1])
    assert "not callable" in (st["not-a-launch"][0][1] or "")
    assert st["wrong-shape"][0][0] == "error"
    assert st["wrong-dtype"][0][0] == "failed"
    res = CliRunner().invoke(main, ["replay", str(tmp_path / "p.zarr"),
                                    "--selectors", "reference", "--selector", f"{FAULTY}:make_wrong_dtype",
                                    "--strict"])
    assert res.exit_code == 1 and "--strict" in res.output


def test_damaged_case_is_reported_invalid_and_the_others_replay(tmp_path: Path) -> None:
    root = _archive(tmp_path, 2)
    chunk = next(p for p in (root / "cases" / "p0" / "values" / "c").rglob("*") if p.is_file())
    chunk.write_bytes(chunk.read_bytes()[:-3])
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(root), "--selectors", "reference", "--json", str(out)])
    assert res.exit_code == 0, res.output
    cases = {c["case_id"]: c for c in json.loads(out.read_text())["cases"]}
    assert "checksum error" in cases["p0"]["invalid"]
    assert cases["p1"]["invalid"] is None and cases["p1"]["results"][0]["status"] == "ok"
    res = CliRunner().invoke(main, ["replay", str(root), "--selectors", "reference", "--strict"])
    assert res.exit_code == 1 and "p0 (invalid)" in res.output
