"""What a new user reads (issue 30's list): every table of every command within 80 columns and without
trailing spaces (one renderer, --wide for all), one time unit per device kind, progress off a terminal,
--case globs and one natural case order everywhere, incomplete cases and unusable paths in one line,
and the small wording points."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

from logitreplay.archive import Archive, Case
from logitreplay.archive.ids import natural_order, short_id
from logitreplay.cli import common, main
from logitreplay.replay import report
from logitreplay.replay.environment import environment
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.report import Column, render
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import plugins  # noqa: E402


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def too_wide_or_padded(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > 80 or line != line.rstrip()]


def _tiny(case_id: str, cols: int = 16) -> Case:
    values = np.arange(2 * cols, dtype=np.float32)
    return Case.from_rows(case_id, values, np.zeros(2, np.int32), np.full(2, cols, np.int32), top_k=4, cols=cols)


# -- one renderer


def test_render_folds_text_columns_to_fit_and_never_pads_a_line() -> None:
    cols = [Column("case", fold=True), Column("n", right=True), Column("why", fold=True)]
    rows = [["a-very-long-case-id-that-would-not-fit-c1024-r512-k512", "12345", "because " * 12],
            ["short", "1", ""]]
    lines = render(cols, rows, 60)
    assert max(map(len, lines)) <= 60 and all(line == line.rstrip() for line in lines)
    assert lines[0].startswith("case") and set(lines[1]) == {"\u2500"}
    assert "12345" in lines[2]  # numbers stay whole, on the row's first line
    assert "".join(line.split()[0] for line in lines[2:] if not line.startswith("short")).startswith(
        "a-very-long-case-id")
    assert lines[2].split()[0].endswith("-")  # an id folds after a hyphen
    wide = render(cols, rows, None)
    assert len(wide) == 4  # --wide: one line per row, however wide


def test_a_narrow_table_with_more_ratios_than_fit_leaves_the_last_out_and_says_so() -> None:
    names = ["reference", "native", "deepselect", "split"]
    case = CaseResult("stride-normal-c16384-r1024-k512-bf16-requests-s16640", 1024, 16384, 512, "bfloat16", 16384,
                      "normal", 1 << 26)
    case.floor_us = 130.1
    case.results = [SelectorResult(s, "ok", timing=Timing([1234.5, 1200.0, 1250.0], "events")) for s in names]
    result = ReplayResult("cuda:0", "CUDA kernel time", TimingProtocol(), {}, "native", names, [case])
    lines, left_out = report.table(result)
    assert max(map(len, lines)) <= 80 and left_out == ["split"]
    assert lines[0].split()[-2:] == ["/ref", "/dsel"]
    assert "not shown for lack of room: /split (--wide shows every column)" in report.legend(result, False, left_out)
    assert report.table(result, wide=True)[1] == [] and "native/split" in report.table(result, wide=True)[0][0]
    assert all(len(line) <= 80 for text in report.heading(result) for line in report.wrap(text))
    assert len(report.heading(result)[1]) <= 80  # the CUDA protocol line fits on its own


# -- one time unit per device kind


def _result(device: str, median_us: float) -> ReplayResult:
    case = CaseResult("a-normal-c64-r6-k8", 6, 64, 8, "float32", 64, "normal", 1000)
    case.results = [SelectorResult("reference", "ok", timing=Timing([median_us] * 3, "wall"))]
    env = environment(torch.device("cpu"))  # a report as replay writes it: compare reads it against the schema
    return ReplayResult(device, "t", TimingProtocol.for_device("cpu" if device == "cpu" else "cuda"), env,
                        "reference", ["reference"], [case])


@pytest.mark.parametrize(("device", "median_us", "cell", "name"), [
    ("cpu", 84749.0, "84.7", "ms"), ("cpu", 104000.0, "104.0", "ms"), ("cpu", 52.0, "0.05", "ms"),
    ("cuda:0", 84749.0, "84749", "us"), ("cuda:0", 104.0, "104.0", "us")])
def test_a_device_kind_has_one_unit_whatever_the_run_measured(device: str, median_us: float, cell: str,
                                                              name: str) -> None:
    lines, _ = report.table(_result(device, median_us))
    assert lines[2].split()[-1] == cell
    assert report.heading(_result(device, median_us))[0].endswith(f"medians in {name}")


def test_compare_and_the_plot_use_the_device_unit(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps(_result("cpu", 84749.0).to_json()))
    res = cli("compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert res.exit_code == 0, res.output
    assert "base ms" in res.output and "84.7" in res.output and not too_wide_or_padded(res.output)
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = report.plot_figure(_result("cpu", 84749.0))
    assert fig.axes[0].get_ylabel().endswith("(ms)")
    plt.close(fig)


# -- progress off a terminal


def test_a_replay_off_a_terminal_prints_progress_lines_on_stderr(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.zarr"
    a = Archive.create(path)
    for cid in ("p-c64-1", "p-c64-2", "p-c64-3"):
        a.write(plugins.plugin_case(cid))
    monkeypatch.setattr(common, "PROGRESS_EVERY_S", 0.0)
    res = cli("replay", str(path), "--selectors", "reference", "--rounds", "1", "--json")
    assert res.exit_code == 0, res.output
    assert re.search(r"^replay: 1 of 3 done after \d+ s, about \d+ s left$", res.stderr, re.M), res.stderr
    assert json.loads(res.stdout)["selectors"] == ["reference"]  # stdout stays the JSON alone


def test_full_scale_on_a_cpu_warns_up_front(monkeypatch: pytest.MonkeyPatch) -> None:
    from logitreplay.cli import replay as replay_cli

    def stop(*args: object, **kwargs: object) -> None:
        raise SystemExit(3)

    monkeypatch.setattr(replay_cli, "run_replay", stop)
    res = cli("replay", "--scale", "full", "--device", "cpu")
    assert res.exit_code == 3
    said = " ".join(res.stderr.split())
    assert "--scale full on a CPU" in said and "64x the logits of --scale small" in said


# -- --case globs and one order everywhere


def test_archive_cases_come_in_natural_order_and_inspect_takes_globs(tmp_path: Path) -> None:
    path = tmp_path / "o.zarr"
    a = Archive.create(path)
    for cid in ("w-c12800", "w-c1024", "w-c6400", "v-c16"):
        a.write(_tiny(cid))
    assert Archive.open(path).case_ids() == ["v-c16", "w-c1024", "w-c6400", "w-c12800"]
    assert natural_order(["a-normal-c6400-r512", "a-normal-c1024-r512"]) == ["a-normal-c1024-r512",
                                                                             "a-normal-c6400-r512"]
    res = cli("inspect", str(path), "--case", "w-*", "--json")
    assert res.exit_code == 0, res.output
    assert [c["case_id"] for c in json.loads(res.stdout)["cases"]] == ["w-c1024", "w-c6400", "w-c12800"]
    res = cli("inspect", str(path), "--case", "nope*")
    assert res.exit_code == 1 and res.output.strip() == "Error: --case nope*: matches none of the 4 case ids " \
        "(e.g. v-c16; `logitreplay cases` lists them)"


# -- incomplete cases and unusable paths


def test_an_incomplete_case_shows_no_shape_and_names_itself_once(tmp_path: Path) -> None:
    path = tmp_path / "i.zarr"
    a = Archive.create(path)
    a.write(plugins.plugin_case("good-c64"))
    a.write(plugins.plugin_case("cut-c64"))
    meta = path / "cases" / "cut-c64" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["complete"] = False
    meta.write_text(json.dumps(doc))
    res = cli("replay", str(path), "--selectors", "reference", "--rounds", "1")
    assert res.exit_code == 0, res.output
    (row,) = [line for line in res.output.splitlines() if line.startswith("cut-c64")]
    assert row.split()[1:] == ["-", "-", "-", "invalid"], row
    assert not re.search(r"\b0\s+0\s+0\b", row)
    why = [line for line in res.output.splitlines() if line.startswith("invalid: case cut-c64")]
    assert why and why[0].count("cut-c64") == 1, why


def test_a_missing_path_and_a_plain_file_are_one_line_project_errors(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not an archive")
    for args in (["inspect", str(tmp_path / "nope")], ["replay", str(tmp_path / "nope")],
                 ["repair", str(tmp_path / "nope")]):
        res = cli(*args)
        assert res.exit_code == 1 and res.output.strip() == f"Error: {tmp_path / 'nope'}: no such file or directory"
    res = cli("repair", str(notes))
    assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1
    assert res.output.startswith(f"Error: {notes}: not a logitreplay archive") and "Invalid value" not in res.output


# -- small wording


def test_cpu_runs_say_singular_samples_and_no_cuda_protocol(tmp_path: Path) -> None:
    path = tmp_path / "w.zarr"
    Archive.create(path).write(plugins.plugin_case("one-c64"))
    csv_path, plot_path = tmp_path / "r.csv", tmp_path / "r.png"
    args = ["replay", str(path), "--selectors", "reference", "--rounds", "1", "--csv", str(csv_path)]
    if __import__("importlib").util.find_spec("matplotlib") is not None:
        args += ["--plot", str(plot_path)]
    res = cli(*args)
    assert res.exit_code == 0, res.output
    assert "1 alternating round x 1 sample," in res.output and "samples" not in res.output
    assert "CUDA" not in res.output
    assert f"CSV written to {csv_path}" in res.output
    if "--plot" in args:
        assert f"plot written to {plot_path}" in res.output


def test_a_control_s_short_id_drops_the_k_part_too() -> None:
    assert short_id("a-normal-c1024-r512-k512~matched", 1024, 512, 512) == "a-normal~matched"
    assert short_id("c1024-r512-k512~matched", 1024, 512, 512) == "c1024-r512-k512~matched"


# -- every README command that prints a table, on CPU at small scale


@pytest.mark.slow
def test_every_readme_table_fits_80_columns_without_trailing_spaces(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # paths as a user types them: a line holding a long path cannot fit anyway
    arch, rule = "s.zarr", "rule.json"
    # Subsets holding each table's longest ids, widest numbers and every kind of legend line.
    some = ("--case", "a-normal-c12800*", "--case", "c-normal-c3200*", "--rounds", "1")
    commands = [
        ["synth", "--out", arch],
        ["replay", "--case", "b-normaltimes*", *some],  # make demo
        ["replay", "--suite", "stress", "--rounds", "1", "--case", "stride-*", "--case", "bigk-*"],
        ["replay", "--suite", "decode", "--rounds", "1", "--case", "batch-normal-c5120-b64-n2*", "--case",
         "dist-normalplus*"],
        ["replay", arch, "--selectors", "reference,native,deepselect,split", "--recommend", "--rule-out", rule,
         "--json", "r1.json", *some],
        ["replay", arch, "--json", "r2.json", *some],
        ["compare", "r1.json", "r2.json"],
        ["replay", arch, "--controls", "matched,ablate,shuffle", "--case", "a-normal-c1024*", "--rounds", "1"],
        ["replay", arch, "--selectors", "auto,native,deepselect", "--rule", rule, *some],
        ["replay", arch, "--per-forward", *some],
        ["inspect", arch],
        ["inspect", arch, "--work"],
        ["repair", arch, "--dry-run"],
    ]
    tables = 0
    for args in commands:
        res = cli(*args)
        assert res.exit_code == 0, (args, res.output)
        assert not too_wide_or_padded(res.output), (args, too_wide_or_padded(res.output))
        tables += res.output.count("\u2500\u2500\u2500")
    assert tables >= 11  # every command above but synth, --per-forward on a synthetic archive and repair


def test_the_capture_summary_fits_80_columns(capsys: pytest.CaptureFixture[str]) -> None:
    from logitreplay.cli.capture import _print_summary

    _print_summary({"captured": 40, "bytes": 2**30, "archive": "cap.zarr", "tokens": 4096, "tokens_run": 4096,
                    "model": "deepseek-ai/DeepSeek-V3.2", "revision": "0123456789abcdef", "sequences": 2,
                    "chunk_size": 2048, "device": "cuda:0", "seconds": 12.5, "dropped": {}, "skipped": {},
                    "widths": {f"model.layers.{i}.self_attn.indexer": [1024 * j for j in range(1, 17)]
                               for i in range(3)}})
    out = capsys.readouterr().out
    assert "model.layers.0" in out and "16384" in out and not too_wide_or_padded(out)


def test_build_kernels_lists_its_libraries_within_80_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without nvcc here, the build itself is replaced; the table is what the command prints of its results."""
    from logitreplay.selectors.cuda import build

    cache = "/home/someone/.cache/logitreplay/kernels"
    monkeypatch.setattr(build, "check_arch", lambda arch, toolchain: None)
    monkeypatch.setattr(build, "toolchain", lambda: None)
    monkeypatch.setattr(build, "build", lambda name, arch: f"{cache}/{name}-sm_90a-0123456789abcdef0123.so")
    res = cli("build-kernels", "--arch", "sm_90a")
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[0].split() == ["kernel", "arch", "seconds", "library"]
    assert "deepselect" in res.output and not too_wide_or_padded(res.output)
