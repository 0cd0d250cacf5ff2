"""Issue 40, finding 2: nothing lost. A replay stopped by Ctrl-C (SIGINT) or SIGTERM writes the table, the
JSON and the CSV of the cases it finished, the report marked partial, and exits 130 or 143; `replay
--resume R.json` replays exactly the cases it lacks and writes the report a run never stopped writes."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logitreplay.archive import Archive
from logitreplay.replay.results import read_json
from tests.dying_plugins import STALL_CASE, STALL_MARKER
from tests.plugins import plugin_case

ROOT = Path(__file__).resolve().parents[1]
IDS = ["p0", "p1", "p2", "p3"]


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("interrupt") / "a.zarr"
    a = Archive.create(path)
    for cid in IDS:
        a.write(plugin_case(cid))
    return str(path)


def _logitreplay(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, STALL_MARKER: str(tmp_path / "stalling"), STALL_CASE: "p2",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "logitreplay.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_replay_keeps_its_finished_cases_and_resumes(archive: str, tmp_path: Path,
                                                                     sig: signal.Signals) -> None:
    proc = _logitreplay(tmp_path, "replay", archive, "--device", "cpu", "--selectors", "reference", "--selector",
                        "tests.dying_plugins:make_stalls", "--rounds", "1", "--json", "r.json", "--csv", "r.csv")
    deadline = time.monotonic() + 300
    while not (tmp_path / "stalling").exists():  # p0 and p1 are done, p2 is in progress
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig.value, err
    assert "Traceback" not in err
    assert f"PARTIAL: stopped by {sig.name} after 2 of 4 cases" in out
    assert "--resume r.json" in out
    partial = json.loads((tmp_path / "r.json").read_text())
    assert [c["case_id"] for c in partial["cases"]] == ["p0", "p1"]
    assert partial["partial"]["signal"] == sig.name and partial["partial"]["cases_total"] == 4
    assert all(r["status"] == "ok" for c in partial["cases"] for r in c["results"])
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [(r["case_id"], r["selector"]) for r in rows] == [(c, s) for c in ("p0", "p1") for s in ("reference", "stalls")]
    assert {r["partial"] for r in rows} == {f"stopped by {sig.name} after 2 of 4 cases"}

    proc = _logitreplay(tmp_path, "replay", "--resume", "r.json")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "Traceback" not in err and "PARTIAL" not in out
    whole = read_json(tmp_path / "r.json")
    assert whole.partial is None
    assert [c.case_id for c in whole.cases] == Archive.open(archive).case_ids() == IDS
    assert all(r.status == "ok" and r.timing for c in whole.cases for r in c.results)
    assert [[r.selector for r in c.results] for c in whole.cases] == [["reference", "stalls"]] * 4
    for earlier, now in zip(partial["cases"], whole.cases[:2], strict=True):  # kept, not replayed
        assert earlier["results"][0]["timing"]["samples_us"] == now.results[0].timing.samples_us
    assert [r["case_id"] for r in csv.DictReader((tmp_path / "r.csv").open())][::2] == IDS
    assert {r["partial"] for r in csv.DictReader((tmp_path / "r.csv").open())} == {""}


@pytest.mark.slow
def test_an_interrupted_isolated_replay_keeps_the_results_of_the_selector_that_went_further(
        archive: str, tmp_path: Path) -> None:
    """Under --isolate the reference replays every case before `stalls` starts: its results on the cases
    `stalls` never reached are kept too, and --resume replays those cases in full."""
    proc = _logitreplay(tmp_path, "replay", archive, "--device", "cpu", "--selectors", "reference", "--selector",
                        "tests.dying_plugins:make_stalls", "--rounds", "1", "--isolate", "--json", "r.json",
                        "--csv", "r.csv")
    deadline = time.monotonic() + 300
    while not (tmp_path / "stalling").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "PARTIAL: stopped by SIGINT after 2 of 4 cases" in out
    partial = json.loads((tmp_path / "r.json").read_text())
    assert [[r["selector"] for r in c["results"]] for c in partial["cases"]] == \
        [["reference", "stalls"]] * 2 + [["reference"]] * 2
    rows = {(r["case_id"], r["selector"]): r["status"] for r in csv.DictReader((tmp_path / "r.csv").open())}
    assert rows[("p3", "reference")] == "ok" and rows[("p3", "stalls")] == "not run"

    proc = _logitreplay(tmp_path, "replay", "--resume", "r.json")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    whole = read_json(tmp_path / "r.json")
    assert whole.partial is None and [c.case_id for c in whole.cases] == IDS
    assert all(r.status == "ok" for c in whole.cases for r in c.results) and all(len(c.results) == 2 for c in whole.cases)


def test_resume_refuses_a_complete_report_and_changed_options(archive: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from logitreplay.cli import main

    done = tmp_path / "done.json"
    res = CliRunner().invoke(main, ["replay", archive, "--device", "cpu", "--selectors", "reference", "--rounds", "1",
                                    "--case", "p0", "--json", str(done)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["replay", "--resume", str(done)])
    assert res.exit_code == 1 and "is a complete report (not marked partial); nothing to resume" in res.output
    res = CliRunner().invoke(main, ["replay", "--resume", str(done), "--rounds", "3"])
    assert res.exit_code == 2 and "--rounds cannot change them" in res.output


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_replay_over_ranks_keeps_every_ranks_finished_cases(archive: str, tmp_path: Path,
                                                                           sig: signal.Signals) -> None:
    """`--devices`: the launcher passes the signal on to each rank once, and rank 0 writes the partial report
    of every rank's finished cases with the whole run's configuration, which `--resume` completes."""
    proc = _logitreplay(tmp_path, "replay", archive, "--device", "cpu", "--devices", "0,1", "--selectors",
                        "reference", "--selector", "tests.dying_plugins:make_stalls", "--rounds", "1",
                        "--json", "r.json", "--csv", "r.csv")
    deadline = time.monotonic() + 300
    while not (tmp_path / "stalling").exists():  # a rank is in p2, which stalls
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + sig.value, err
    assert "Traceback" not in err and "PARTIAL: stopped by" in out
    partial = json.loads((tmp_path / "r.json").read_text())
    done = [c["case_id"] for c in partial["cases"]]
    assert "p2" not in done and done == [c for c in IDS if c in done]
    assert partial["partial"]["cases_done"] == len(done) and partial["partial"]["cases_total"] == len(IDS)
    assert {r["partial"] for r in csv.DictReader((tmp_path / "r.csv").open())} <= {
        f"stopped by {sig.name} after {len(done)} of 4 cases"}

    proc = _logitreplay(tmp_path, "replay", "--resume", "r.json")
    out, err = proc.communicate(timeout=300)
    whole = read_json(tmp_path / "r.json")
    assert whole.partial is None and [c.case_id for c in whole.cases] == IDS
