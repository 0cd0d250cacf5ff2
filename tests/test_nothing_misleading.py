"""Nothing misleading (issue 40, findings 3, 4, 5, 7 and 8): every output path and input file checked
before the work, `compare` that states its samples and refuses to judge on too few, ids in tables that
`--case` takes, the commands a user reaches for (`cases`, `report`, shell completion), and the smaller
points (help within 80 columns, options named in their errors, the plot, `merge`'s hosts)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import click
import numpy as np
import pytest
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult, write_json

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import plugins  # noqa: E402
from tests.test_new_user import cli, one_line_error  # noqa: E402


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("arch") / "two.zarr"
    a = Archive.create(path)
    a.write(plugins.plugin_case("b-normal-c64-r6-k8"))
    a.write(plugins.plugin_case("c-flood-c64-b9-n1-k8-full"))
    a.write(plugins.plugin_case("run-00001-L00-w64"))  # as a capture names its cases
    return str(path)


def _report(samples: int, cases: int = 3, device: str = "cpu", seed: int = 0, prefix: str = "c") -> ReplayResult:
    """A report of `cases` cases x (reference, native) with `samples` samples each of ~1000 us, 2% noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(cases):
        case = CaseResult(f"{prefix}{i}-c1024-r64-k16", 64, 1024, 16, "float32", 1024, "normal", 1 << 18)
        case.results = [SelectorResult(s, "ok", timing=Timing(list(1000.0 * rng.normal(1, 0.02, samples)), "wall"))
                        for s in ("reference", "native")]
        out.append(case)
    env = {"python": "3.11", "torch": "2", "numpy": "2", "platform": "linux", "cpu": "x86", "host": "h1"}
    return ReplayResult(device, "wall clock", TimingProtocol(), env, "native", ["reference", "native"], out)


# -- finding 3: outputs and inputs checked before the work


@pytest.mark.parametrize(("name", "message"), [
    ("out.txt", "matplotlib does not write .txt files"),
    ("noext", "has no extension to name its format"),
])
def test_a_plot_path_matplotlib_cannot_write_is_refused_before_the_replay(archive: str, tmp_path: Path, name: str,
                                                                         message: str) -> None:
    pytest.importorskip("matplotlib")
    res = cli("replay", archive, "--selectors", "reference", "--plot", str(tmp_path / name))
    assert one_line_error(res) and message in res.output and "--plot" in res.output, res.output
    assert not list(tmp_path.iterdir())


def test_a_plot_is_written_exactly_where_asked_in_the_format_its_extension_names(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    write_json(_report(3), tmp_path / "r.json")
    res = cli("report", str(tmp_path / "r.json"), "--plot", str(tmp_path / "p.svg"))
    assert res.exit_code == 0, res.output
    assert f"plot written to {tmp_path / 'p.svg'}" in res.output
    assert b"<svg" in (tmp_path / "p.svg").read_bytes()[:400]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.svg", "r.json"]


def test_csv_refuses_to_overwrite_a_file_of_another_kind_as_json_does(archive: str, tmp_path: Path) -> None:
    report = tmp_path / "r2.json"
    report.write_text('{"schema": "logitreplay.replay/1"}\n')
    res = cli("replay", archive, "--selectors", "reference", "--csv", str(report))
    assert one_line_error(res) and "--csv" in res.output and "refusing to overwrite" in res.output, res.output
    assert report.read_text() == '{"schema": "logitreplay.replay/1"}\n'
    table = tmp_path / "t.csv"
    res = cli("replay", archive, "--selectors", "reference", "--csv", str(table), "--rounds", "1")
    assert res.exit_code == 0, res.output
    again = cli("replay", archive, "--selectors", "reference", "--csv", str(table), "--rounds", "1")
    assert again.exit_code == 0, again.output  # its own kind is written over


def test_a_rule_that_is_not_a_rule_is_one_line_before_the_replay(archive: str, tmp_path: Path) -> None:
    bogus = tmp_path / "rule.json"
    bogus.write_text('{"not": "a rule"}')
    res = cli("replay", archive, "--selectors", "auto,reference", "--rule", str(bogus))
    assert one_line_error(res) and "not a dispatch rule" in res.output and "ERROR" not in res.output, res.output


def test_rule_out_refuses_to_overwrite_a_file_that_is_not_json(archive: str, tmp_path: Path) -> None:
    data = tmp_path / "x.csv"
    data.write_text("case_id,cols\n")
    res = cli("replay", archive, "--selectors", "reference", "--rule-out", str(data))
    assert one_line_error(res) and "--rule-out" in res.output and data.read_text() == "case_id,cols\n"


# -- finding 4: compare


def _compare(tmp_path: Path, base: ReplayResult, new: ReplayResult, *args: str) -> Result:
    write_json(base, tmp_path / "base.json")
    write_json(new, tmp_path / "new.json")
    return cli("compare", str(tmp_path / "base.json"), str(tmp_path / "new.json"), *args)


def test_identical_runs_of_three_samples_claim_no_change_and_fail_above_refuses(tmp_path: Path) -> None:
    res = _compare(tmp_path, _report(3, seed=0), _report(3, seed=1))
    assert res.exit_code == 0, res.output
    assert "faster" not in res.output.replace("0 faster", "") and "slower" not in res.output.replace("0 slower", "")
    assert "6 too few samples" in res.output and " 3/3 " in res.output and "too few: under 10" in res.output
    failed = _compare(tmp_path, _report(3, seed=0), _report(3, seed=1), "--fail-above", "1.03")
    assert one_line_error(failed) and "--fail-above needs at least 10 samples" in failed.output, failed.output
    enough = _compare(tmp_path, _report(20, seed=0), _report(20, seed=1), "--fail-above", "1.03", "--json")
    assert enough.exit_code == 0, enough.output
    rows = json.loads(enough.stdout)["rows"]
    assert {(r["base_samples"], r["new_samples"]) for r in rows} == {(20, 20)}


def test_reports_with_no_case_in_common_exit_nonzero(tmp_path: Path) -> None:
    res = _compare(tmp_path, _report(20), _report(20, prefix="d"), "--fail-above", "1.03")
    assert one_line_error(res) and "nothing to compare" in res.output, res.output


def test_a_binary_file_given_to_compare_is_one_line_naming_it(tmp_path: Path) -> None:
    png = tmp_path / "r2.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    write_json(_report(3), tmp_path / "r.json")
    res = cli("compare", str(png), str(tmp_path / "r.json"))
    assert one_line_error(res) and str(png) in res.output and "not a replay report" in res.output, res.output


# -- finding 8: the smaller points


def _commands(group: click.Group, path: list[str]) -> list[list[str]]:
    out = [path]
    for name, cmd in group.commands.items():
        out += _commands(cmd, [*path, name]) if isinstance(cmd, click.Group) else [[*path, name]]
    return out


@pytest.mark.parametrize("path", _commands(main, []), ids=lambda p: " ".join(p) or "logitreplay")
def test_help_of_every_command_fits_80_columns(path: list[str]) -> None:
    res = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert res.exit_code == 0, res.output
    assert [line for line in res.output.splitlines() if len(line) > 80] == []


def test_a_bad_poison_names_the_option(archive: str) -> None:
    res = cli("replay", archive, "--poison", "abc")
    assert one_line_error(res) and "--poison" in res.output and "'abc'" in res.output, res.output


def test_controls_help_lists_every_kind_it_accepts() -> None:
    from logitreplay.datasets.controls import KINDS

    for command in ("replay", "synth"):
        option = next(p for p in main.commands[command].params if p.name in ("controls", "control_kinds"))
        assert all(kind in str(option.help) for kind in KINDS), (command, option.help)


def test_merge_names_the_host_of_each_report_never_an_empty_one(tmp_path: Path) -> None:
    a, b = _report(3), _report(3, prefix="d")
    b.environment.pop("host")  # a report from before hosts were recorded
    write_json(a, tmp_path / "a.json")
    write_json(b, tmp_path / "b.json")
    res = cli("merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "m.json"))
    assert res.exit_code == 0, res.output
    hosts = [r["host"] for r in json.loads((tmp_path / "m.json").read_text())["ranks"]]
    assert hosts == ["h1", None]


# -- new commands: report


def test_report_prints_the_table_replay_printed_and_writes_its_csv(archive: str, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    ran = cli("replay", archive, "--selectors", "reference,native", "--rounds", "1", "--json", str(out))
    assert ran.exit_code == 0, ran.output
    shown = cli("report", str(out))
    assert shown.exit_code == 0, shown.output
    table = [line for line in ran.output.splitlines() if not line.startswith("warmup")]
    assert [line for line in shown.output.splitlines() if line in table] == table
    wide = cli("report", str(out), "--wide", "--csv", str(tmp_path / "r.csv"))
    assert "b-normal-c64-r6-k8" in wide.output and f"CSV written to {tmp_path / 'r.csv'}" in wide.output
    assert (tmp_path / "r.csv").read_text().startswith("case_id,")


# -- finding 5: ids in tables are ids --case takes; cases; completion


def _table_ids(output: str) -> list[str]:
    lines = output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("\u2500")) + 1
    end = next(i for i, line in enumerate(lines) if i >= start and ":" in line)  # the legend
    return [line.split()[0] for line in lines[start:end]]


def test_every_id_a_table_shows_is_an_id_case_takes(archive: str) -> None:
    res = cli("replay", archive, "--selectors", "reference", "--rounds", "1")
    assert res.exit_code == 0, res.output
    shown = _table_ids(res.output)
    assert shown == ["b-normal", "c-flood-b9-n1-full", "run-00001-L00"], res.output
    for case_id in shown:
        listed = cli("cases", archive, "--case", case_id, "--json")
        assert listed.exit_code == 0, listed.output
        assert [c["short_id"] for c in json.loads(listed.stdout)] == [case_id]
    picked = cli("replay", archive, "--selectors", "reference", "--rounds", "1", "--case", "run-00001-L00",
                 "--case", "c-flood-b9*", "--json")
    assert picked.exit_code == 0, picked.output
    assert [c["case_id"] for c in json.loads(picked.stdout)["cases"]] == ["c-flood-c64-b9-n1-k8-full",
                                                                         "run-00001-L00-w64"]


def test_cases_lists_ids_one_a_line_with_shapes(archive: str) -> None:
    res = cli("cases", archive)
    assert res.exit_code == 0, res.output
    assert [line.split()[0] for line in res.output.splitlines()] == [
        "b-normal-c64-r6-k8", "c-flood-c64-b9-n1-k8-full", "run-00001-L00-w64"]
    assert res.output.splitlines()[0].endswith("64 x 6, k 8, float32")
    suite = cli("cases", "--suite", "stress", "--scale", "small", "--case", "bin-flood-b9*", "--json")
    assert suite.exit_code == 0, suite.output
    assert {c["case_id"] for c in json.loads(suite.stdout)} >= {"bin-flood-c5120-b9-n1-k256-full-f384"}
    none = cli("cases", archive, "--case", "nothing*")
    assert one_line_error(none) and "logitreplay cases" in none.output


def _complete(words: str) -> list[str]:
    env = {"_LOGITREPLAY_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    res = CliRunner().invoke(main, [], prog_name="logitreplay", env=env)
    assert res.exit_code == 0, res.output
    return [line.partition(",")[2] for line in res.output.splitlines() if line]


def test_the_shell_completes_selector_names_and_case_ids(archive: str) -> None:
    assert _complete("logitreplay replay --selectors reference,na") == ["reference,native", "reference,native-det"]
    assert "deepselect" in _complete("logitreplay replay --baseline d")
    assert _complete(f"logitreplay replay {archive} --case run") == ["run-00001-L00-w64", "run-00001-L00"]
    assert _complete("logitreplay inspect nowhere.zarr --case a") == []  # nothing to offer, no error


# -- finding 8: --per-forward on a CPU


def _forwards(timer: str, share: float | None, note: str | None = None) -> Any:
    from logitreplay.replay.per_forward import ArchiveForwards, SelectorTotal

    return ArchiveForwards("cap.zarr", 2, forwards=3, calls=6, covered_calls=6, exact_width_calls=6,
                           forward_us=2000.0, timer=timer, share_note=note,
                           totals=[SelectorTotal("native", 6266.0, share)])


def test_per_forward_on_a_cpu_keeps_one_unit_and_explains_shares_over_100_percent() -> None:
    from rich.console import Console

    from logitreplay.cli.decisions import print_per_forward

    console = Console(record=True, width=200)
    print_per_forward([_forwards("wall", 3.133)], None, console, "cpu")
    text = console.export_text()
    assert "forward 2.0 ms (wall)" in text and not re.search(r"\d us\b", text), text
    assert "313.3%" in text and "share above 100%: the selector's calls take longer" in text


def test_a_forward_timed_on_a_gpu_gives_no_share_against_a_cpu_replay() -> None:
    from logitreplay.replay.per_forward import _no_share

    assert _no_share("cuda-events", "cuda:0") is None and _no_share("wall", "cpu") is None
    assert "timed on a GPU (cuda-events), this replay ran on cpu" in str(_no_share("cuda-events", "cpu"))


# -- finding 8: the plot


@pytest.mark.parametrize("n", [2, 41, 150])
def test_the_plot_stays_within_its_width_its_labels_never_overlap_and_it_names_its_error_bars(n: int) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from logitreplay.replay import report

    result = _report(5, cases=n, prefix="bin-flood-b9-n1-full-f")
    fig = report.plot_figure(result)
    ax = fig.axes[0]
    assert fig.get_figwidth() * 120 <= 1920
    fig.canvas.draw()
    boxes = [t.get_window_extent() for t in ax.get_xticklabels() if t.get_text()]
    assert boxes and all(not a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert "p10-p90" in ax.get_title()
    plt.close(fig)


def test_a_report_of_the_wrong_shape_is_one_line_before_anything_reads_it(tmp_path: Path) -> None:
    data = _report(3).to_json()
    data["cases"][0]["rows"] = "many"
    (tmp_path / "r.json").write_text(json.dumps(data))
    for command in (["report"], ["compare", str(tmp_path / "r.json")]):
        res = cli(*command, str(tmp_path / "r.json"))
        assert one_line_error(res) and "does not match report.schema.json" in res.output, res.output


def test_merge_out_refuses_to_overwrite_a_file_that_is_not_json(tmp_path: Path) -> None:
    write_json(_report(3), tmp_path / "a.json")
    table = tmp_path / "t.csv"
    table.write_text("case_id,cols\n")
    res = cli("merge", str(tmp_path / "a.json"), "--out", str(table))
    assert one_line_error(res) and "--out" in res.output and table.read_text() == "case_id,cols\n"


def test_compare_says_when_a_report_is_partial(tmp_path: Path) -> None:
    new = _report(20, seed=1)
    new.partial = {"signal": "SIGINT", "cases_done": 3, "cases_total": 9, "config": {}}
    res = _compare(tmp_path, _report(20), new)
    assert res.exit_code == 0 and "NEW is partial (stopped by SIGINT after 3 of 9 cases)" in " ".join(
        res.output.split()), res.output
