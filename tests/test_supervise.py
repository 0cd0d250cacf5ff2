"""The parent supervises the replay (replay/isolate.py): a selector that takes its worker process down
(os._exit(0), a segfault, SIGKILL as from the OOM killer) ends its own result on that case with a
one-line reason, every other selector and case still verifies and times in a fresh worker, the report
is written, and --strict exits 1. Exhausting memory is the selector's own error; a schema check that
cannot run says so and the report is still written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.replay import results
from tests.plugins import plugin_case

DYING = "tests.dying_plugins"


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("supervise") / "a.zarr"
    a = Archive.create(path)
    for i in range(2):
        a.write(plugin_case(f"p{i}"))
    return str(path)


def _replay(archive: str, out: Path, *args: str) -> tuple[Result, list[dict]]:
    res = CliRunner().invoke(main, ["replay", archive, "--selectors", "reference", "--rounds", "1",
                                    "--json", str(out), *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res, json.loads(out.read_text())["cases"]


@pytest.mark.parametrize(("factory", "name", "reason"), [
    ("make_exits", "exits", "worker died: exit status 0"),
    ("make_segfaults", "segfaults", "worker died: SIGSEGV"),
    ("make_killed", "killed", "worker died: SIGKILL (out of memory?)"),
])
def test_a_selector_that_kills_its_process_loses_only_its_own_results(archive: str, tmp_path: Path, factory: str,
                                                                      name: str, reason: str) -> None:
    res, cases = _replay(archive, tmp_path / "r.json", "--selector", f"{DYING}:{factory}",
                         "--selector", "tests.plugins:make_good", "--strict")
    assert res.exit_code == 1, res.output
    assert f"--strict: 2 failed, errored or invalid: p0/{name}, p1/{name}" in res.output
    for case in cases:
        by_name = {r["selector"]: r for r in case["results"]}
        assert list(by_name) == ["reference", name, "good"], case
        assert by_name[name]["status"] == "error" and by_name[name]["reason"].startswith(reason), by_name[name]
        assert "\n" not in by_name[name]["reason"]
        for ok in ("reference", "good"):  # verified and timed, before and after the death
            assert by_name[ok]["status"] == "ok" and by_name[ok]["timing"]["samples_us"], by_name[ok]


def test_a_selector_that_exhausts_memory_has_its_own_error(archive: str, tmp_path: Path) -> None:
    res, cases = _replay(archive, tmp_path / "r.json", "--selector", f"{DYING}:make_out_of_memory")
    assert res.exit_code == 0, res.output
    for case in cases:
        ref, oom = case["results"]
        assert ref["status"] == "ok"
        assert (oom["status"], oom["reason"]) == ("error", "MemoryError: out of host memory")
    assert not any("worker died" in n for n in json.loads((tmp_path / "r.json").read_text())["notes"])


def test_a_schema_check_that_cannot_run_still_writes_the_report(archive: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> dict:
        raise OSError("report.schema.json: unreadable")

    monkeypatch.setattr(results, "schema", broken)
    res, cases = _replay(archive, tmp_path / "r.json")
    assert res.exit_code == 0, res.output
    assert [c["results"][0]["status"] for c in cases] == ["ok", "ok"]
    assert ("note: the report's schema check could not run (OSError: report.schema.json: unreadable); "
            "written unchecked") in res.output
