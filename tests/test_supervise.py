"""The parent supervises the replay (replay/isolate.py): a selector that takes its worker process down
(os._exit(0), a segfault, SIGKILL as from the OOM killer) ends its own result on that case with a
one-line reason, every other selector and case still verifies and times in a fresh worker, the report
is written, and --strict exits 1. Exhausting memory is the selector's own error; a schema check that
cannot run says so and the report is still written. A worker whose exit never comes once its results are
in is killed, and one that cannot be reaped even then is left behind, in its selector's reason, instead
of awaited without end; no case restarts workers without end."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.replay import isolate, results
from logitreplay.replay.results import CaseResult, SelectorResult
from tests.dying_plugins import UNREAPABLE_PARENT
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


@pytest.mark.slow
def test_a_selector_that_exhausts_memory_has_its_own_error(archive: str, tmp_path: Path) -> None:
    res, cases = _replay(archive, tmp_path / "r.json", "--selector", f"{DYING}:make_out_of_memory")
    assert res.exit_code == 0, res.output
    for case in cases:
        ref, oom = case["results"]
        assert ref["status"] == "ok"
        assert (oom["status"], oom["reason"]) == ("error", "MemoryError: out of host memory")
    assert not any("worker died" in n for n in json.loads((tmp_path / "r.json").read_text())["notes"])


@pytest.mark.slow
def test_a_selector_that_hoards_all_memory_loses_only_its_own_results(archive: str, tmp_path: Path) -> None:
    """Issue 40, finding 9: in the worker it shares (no --isolate), a selector that takes every byte and
    keeps it once took the reference's results with it; they now run again in a fresh worker."""
    res, cases = _replay(archive, tmp_path / "r.json", "--selector", f"{DYING}:make_hoards",
                         "--selector", "tests.plugins:make_good")
    assert res.exit_code == 0, res.output
    for case in cases:
        by_name = {r["selector"]: r for r in case["results"]}
        assert list(by_name) == ["reference", "hoards", "good"], case
        assert by_name["hoards"]["status"] == "error" and "MemoryError" in by_name["hoards"]["reason"]
        for ok in ("reference", "good"):
            assert by_name[ok]["status"] == "ok" and by_name[ok]["timing"]["samples_us"], by_name[ok]
    notes = json.loads((tmp_path / "r.json").read_text())["notes"]
    assert sum(n.startswith("memory ran out in a worker") for n in notes) == 1, notes


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


@pytest.mark.timeout(120)  # a worker's exit used to be awaited for 600 s
def test_a_worker_that_never_exits_after_its_last_result_is_killed(archive: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolate, "EXIT_S", 1.0)
    res, cases = _replay(archive, tmp_path / "r.json", "--selector", f"{DYING}:make_lingers", "--strict")
    assert res.exit_code == 0, res.output
    assert [[r["status"] for r in c["results"]] for c in cases] == [["ok", "ok"]] * 2


@pytest.mark.timeout(120)
def test_a_worker_that_cannot_be_reaped_is_left_behind_and_the_run_ends(archive: str, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Past KILL_S the run stops waiting on the worker: its selector's reason says so, the others verify,
    the report is written and --strict exits 1."""
    monkeypatch.setattr(isolate, "EXIT_S", 0.5)
    monkeypatch.setattr(isolate, "KILL_S", 0.5)
    parent = tmp_path / "parent"
    monkeypatch.setenv(UNREAPABLE_PARENT, str(parent))
    try:
        res, cases = _replay(archive, tmp_path / "r.json", "--selector", f"{DYING}:make_unreapable", "--strict")
    finally:  # the fork server the worker stopped reaps it and serves the next test
        if parent.exists():
            os.kill(int(parent.read_text()), signal.SIGCONT)
    assert res.exit_code == 1, res.output
    assert [[r["status"] for r in c["results"]] for c in cases] == [["ok", "error"]] * 2, res.output
    for c in cases:
        assert "did not end within 0.5 s of SIGKILL: left behind" in c["results"][1]["reason"], c["results"][1]


def test_a_second_end_between_steps_on_one_case_ends_its_unknown_results() -> None:
    """A worker that ends between two selectors' steps settles nothing: a fresh one tries the case again,
    and when it ends there too, the results not yet known are that error and the run goes on after it."""
    job = isolate.Job(("reference", "x"), ("reference", "x"), [], None, "small", "cpu", {}, 1e30, None, start=3,
                      known=("reference",))
    headers = {3: CaseResult("c3", 6, 64, 8, "float32", 64, "test", 0)}
    parts = {3: {"reference": SelectorResult("reference", "ok")}}
    end = isolate._End(3, True, None, "worker died: SIGKILL (out of memory?)")
    stalled: dict[int, tuple[tuple[str, ...], bool]] = {}
    notes: list[str] = []
    assert isolate._after(job, end, 10, headers, parts, stalled, notes) == job and not notes
    following = isolate._after(job, end, 10, headers, parts, stalled, notes)
    assert (following.start, following.known, following.one_by_one) == (4, (), False)
    assert parts[3]["reference"].status == "ok"
    assert (parts[3]["x"].status, parts[3]["x"].reason) == (
        "error", "worker died: SIGKILL (out of memory?) (twice, between steps)")
    assert notes == ["case c3: two workers ended there between steps (worker died: SIGKILL (out of memory?)); "
                     "the run went on after it"]


def test_two_ends_between_steps_on_a_case_reached_mid_run_end_its_results() -> None:
    """The same rule on a case the worker reached after its first one: its first end there, with nothing
    settled, is tried again once, its second ends the case (two workers, as the note says, not three)."""
    job = isolate.Job(("reference", "x"), ("reference", "x"), [], None, "small", "cpu", {}, 1e30, None, start=1)
    headers = {3: CaseResult("c3", 6, 64, 8, "float32", 64, "test", 0)}
    parts: dict[int, dict[str, SelectorResult]] = {}
    end = isolate._End(3, True, None, "worker died: exit status 0")
    stalled: dict[int, tuple[tuple[str, ...], bool]] = {}
    notes: list[str] = []
    again = isolate._after(job, end, 10, headers, parts, stalled, notes)
    assert (again.start, again.known, again.one_by_one) == (3, (), False) and not notes
    following = isolate._after(again, end, 10, headers, parts, stalled, notes)
    assert (following.start, following.known) == (4, ())
    assert [parts[3][n].status for n in ("reference", "x")] == ["error", "error"]
    assert notes == ["case c3: two workers ended there between steps (worker died: exit status 0); the run went "
                     "on after it"]
