"""Selectors that misbehave on purpose (issue 17, item 7): each fails itself, never another selector and
never the run. A plugin that writes into its inputs, or does the work only on the verified call, is
FAILED with no time shown; `sys.exit` or `KeyboardInterrupt` inside it is its own error; under
`--isolate` a broken factory is that selector's result, a launch slower than `--timeout` is cut, and the
child's start-up does not count against the timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from tests.plugins import plugin_case

FAULTY = "tests.adversarial.faulty_plugins"
SLOW_MARKER = "FAULTY_SLOW_MARKER"


def _archive(tmp_path: Path, n: int = 1) -> Path:
    a = Archive.create(tmp_path / "p.zarr")
    for i in range(n):
        a.write(plugin_case(f"p{i}"))
    return tmp_path / "p.zarr"


def _replay(tmp_path: Path, *args: str) -> tuple[Result, dict[str, list[dict]]]:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(_archive(tmp_path)), "--json", str(out), *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    per: dict[str, list[dict]] = {}
    for case in json.loads(out.read_text())["cases"]:
        for r in case["results"]:
            per.setdefault(r["selector"], []).append(r)
    return res, per


@pytest.mark.parametrize(("factory", "name", "check"), [
    ("make_scribbles_on_logits", "scribbles", 6),
    ("make_shrinks_row_ends", "shrinks-ends", 6),
    ("make_only_once", "only-once", 7),
])
def test_a_selector_that_cheats_fails_itself_and_the_next_one_still_verifies(
        tmp_path: Path, factory: str, name: str, check: int) -> None:
    # The cheat runs first, so the reference after it would see its damage if inputs were shared.
    res, per = _replay(tmp_path, "--selectors", "", "--selector", f"{FAULTY}:{factory}",
                       "--selector", "logitreplay.selectors.reference:ReferenceSelector")
    assert res.exit_code == 0, res.output
    bad = per[name][0]
    assert bad["status"] == "failed" and bad["timing"] is None, bad
    assert bad["failures"][0]["check"] == check, bad["failures"]
    assert per["reference"][0]["status"] == "ok" and per["reference"][0]["timing"] is not None


@pytest.mark.parametrize(("factory", "name", "raised"), [
    ("make_exits", "exits", "SystemExit(0)"),
    ("make_interrupts", "interrupts", "KeyboardInterrupt"),
])
def test_exit_or_interrupt_inside_a_plugin_is_its_own_error(tmp_path: Path, factory: str, name: str,
                                                            raised: str) -> None:
    res, per = _replay(tmp_path, "--selectors", "reference", "--selector", f"{FAULTY}:{factory}", "--strict")
    assert res.exit_code == 1 and f"p0/{name}" in res.output.splitlines()[-1], res.output
    assert per[name][0]["status"] == "error" and raised in per[name][0]["reason"]
    assert per["reference"][0]["status"] == "ok"


@pytest.mark.parametrize(("factory", "reason"), [
    ("make_none", "factory returned NoneType"),
    ("make_raises", "factory raised RuntimeError: factory broke"),
    ("make_exits_in_factory", "factory raised SystemExit: 3"),
])
def test_isolated_factory_failure_is_that_selectors_result(tmp_path: Path, factory: str, reason: str) -> None:
    res, per = _replay(tmp_path, "--selectors", "reference", "--selector", f"{FAULTY}:{factory}", "--isolate")
    assert res.exit_code == 0, res.output
    spec = f"{FAULTY}:{factory}"
    assert per[spec][0]["status"] == "error" and reason in per[spec][0]["reason"], per[spec]
    assert per["reference"][0]["status"] == "ok"


@pytest.mark.slow
def test_timeout_counts_the_selector_not_the_childs_start_up(tmp_path: Path) -> None:
    # Start-up (the torch import) takes seconds here; a 2 s timeout still times the reference.
    res, per = _replay(tmp_path, "--selectors", "reference", "--selector", f"{FAULTY}:make_slow", "--timeout", "2")
    assert res.exit_code == 0, res.output
    assert per["reference"][0]["status"] == "ok"
    assert per["slow"][0]["status"] == "error" and "timed out after 2 s" in per["slow"][0]["reason"]


@pytest.mark.parametrize("spec", [".relative:make", "tests.adversarial.faulty_plugins:", "no_such_module_x:make"])
def test_malformed_selector_specs_are_one_line_errors(tmp_path: Path, spec: str) -> None:
    res = CliRunner().invoke(main, ["replay", str(_archive(tmp_path)), "--selector", spec])
    assert res.exit_code != 0 and res.output.startswith("Error:") and len(res.output.strip().splitlines()) == 1, \
        res.output


@pytest.mark.slow
def test_a_real_ctrl_c_still_stops_the_run(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    root = _archive(tmp_path)
    for isolate in ([], ["--isolate"]):
        marker = tmp_path / f"sleeping{len(isolate)}"
        proc = subprocess.Popen([sys.executable, "-m", "logitreplay.cli", "replay", str(root), "--selectors", "",
                                 "--selector", f"{FAULTY}:make_slow", *isolate], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
                                env={**os.environ, SLOW_MARKER: str(marker)})
        deadline = time.monotonic() + 240
        while not marker.exists() and time.monotonic() < deadline:  # the slow launch (30 s) is running
            time.sleep(0.2)
        assert marker.exists()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode != 0 and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err  # one line saying it stopped
