"""What a new user trips on (issue 18), one test per point: one-line errors for unusable output paths,
case ids and filters on replay, a table that fits 80 columns, one --json convention, suggestions for
unknown names, loud failures, defaults that follow the machine, clean temporary folders and shareable
exports, the plot's legend and marks, and the smaller points (inspect's k, plurals, zips made with
`zip -r`, an offline hub id, one-line usage errors, Ctrl-C, dispersion marks)."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result
from rich.console import Console

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.replay import report
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.results import CaseResult, ReplayResult, SelectorResult
from logitreplay.replay.verify import Failure

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import plugins  # noqa: E402


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def one_line_error(res: Result) -> bool:
    return res.exit_code != 0 and len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two cases of the same shape that differ only by id (the rows that read the same in a table)."""
    path = tmp_path_factory.mktemp("arch") / "two.zarr"
    a = Archive.create(path)
    a.write(plugins.plugin_case("b-normal-c64-r6-k8"))
    a.write(plugins.plugin_case("c-normal-c64-r6-k8"))
    return str(path)


# -- 2: output paths that cannot be written are one-line errors, before any work


@pytest.mark.parametrize("command", [["synth", "--out"], ["import", "FILE", "--out"]])
def test_an_existing_regular_file_as_out_directory_is_a_one_line_error(command: list[str], tmp_path: Path) -> None:
    from logitreplay.datasets.export import export_case

    taken = tmp_path / "taken"
    taken.write_text("a file, not a directory")
    st = str(export_case(plugins.plugin_case(), tmp_path / "st"))
    res = cli(*[st if c == "FILE" else c for c in command], str(taken))
    assert one_line_error(res) and "exists and is not a directory" in res.output, res.output


def test_unwritable_csv_fails_before_the_replay_runs(archive: str) -> None:
    res = cli("replay", archive, "--selectors", "reference", "--csv", "/proc/x.csv")
    assert one_line_error(res) and "--csv" in res.output and "cannot write" in res.output, res.output


# -- 3: case ids in the table, --case and --match


def _json_ids(res: Result) -> list[str]:
    return [c["case_id"] for c in json.loads(res.stdout)["cases"]]


def test_replay_table_names_each_case_and_filters_by_glob_and_regex(archive: str) -> None:
    res = cli("replay", archive, "--selectors", "reference", "--rounds", "1")
    assert res.exit_code == 0, res.output
    rows = [line.split()[0] for line in res.output.splitlines() if re.match(r"[bc]-normal\s", line)]
    assert rows == ["b-normal", "c-normal"]  # two rows of one shape, told apart
    res = cli("replay", archive, "--selectors", "reference", "--rounds", "1", "--case", "c-*", "--json")
    assert res.exit_code == 0, res.output
    assert _json_ids(res) == ["c-normal-c64-r6-k8"]
    res = cli("replay", archive, "--selectors", "reference", "--rounds", "1", "--match", "^b-", "--json")
    assert _json_ids(res) == ["b-normal-c64-r6-k8"]
    res = cli("replay", archive, "--selectors", "reference", "--case", "nope*")
    assert one_line_error(res) and "matches none of the 2 case ids" in res.output


# -- 4: 80 columns


def _case(case_id: str, cols: int, times: dict[str, list[float]], fast: bool = True, note: str = "") -> CaseResult:
    c = CaseResult(case_id, 512, cols, 512, "float32", cols, "normal", cols * 512 * 4, fast_path=fast,
                   fast_path_note=note)
    c.results = [SelectorResult(s, "ok", timing=Timing(t, "wall")) for s, t in times.items()]
    return c


def _cpu_result() -> ReplayResult:
    """The demo's shape on a slow CPU: 7-digit microsecond medians, noisy samples, one case off the fast path."""
    cases = [_case(f"a-normal-c{w}-r512-k512", w, {"reference": [355406.2, 290000.0, 371000.0],
                                                     "native": [1895456.1, 1895400.0, 1895500.0],
                                                     "deepselect": [4297130.8, 3000000.0, 4400000.0]})
             for w in (1024, 6400, 12800)]
    cases.append(_case("b-normaltimes1e-8-c1024-r1024-k512", 1024, {"reference": [368000.0] * 3,
                                                                    "native": [1117000.0] * 3,
                                                                    "deepselect": [932300.0] * 3}))
    cases.append(_case("c-normal-c3200-r256-k512", 3200, {"reference": [296000.0] * 3, "native": [968000.0] * 3,
                                                          "deepselect": [2872000.0] * 3},
                       fast=False, note="row stride not 1024-byte aligned"))
    return ReplayResult("cpu", "wall clock of the CPU algorithm models, not kernel times",
                        TimingProtocol.for_device("cpu"), {}, "native", ["reference", "native", "deepselect"], cases)


def _render(result: ReplayResult, width: int, wide: bool = False) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    report.print_report(result, console, wide)
    return console.export_text()


def test_the_table_fits_80_columns_without_splitting_numbers_or_the_fast_path_note() -> None:
    result = _cpu_result()
    text = _render(result, 80)
    lines = text.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80
    table_rows = [line for line in lines if re.match(r"(a|b|c)-normal", line)]
    assert len(table_rows) == 5  # one line per case: no cell wrapped
    assert "b-normaltimes1e-8" in text and "4297~" in text and "1895" in text  # ms, whole, marked when noisy
    assert all(line == line.rstrip() for line in lines)
    assert [line for line in lines if "fast path" in line] == [
        "DS fast path (vLLM): not for 1 case: row stride not 1024-byte aligned"]
    assert "selectors: ref = reference, nat = native, dsel = deepselect" in text
    wide = _render(result, 250, wide=True)
    assert "native/deepselect" in wide and "c-normal-c3200-r256-k512" in wide and "no: row stride" in wide


def test_recommend_rules_do_not_list_case_ids() -> None:
    from logitreplay.replay.recommend import recommend

    cases = [_case(f"case-{w}", w, {"native": [n], "deepselect": [d]}) for w, n, d in
             ((1024, 50.0, 200.0), (4096, 100.0, 200.0), (16384, 400.0, 200.0))]
    result = ReplayResult("cuda:0", "t", TimingProtocol(), {}, "native", ["native", "deepselect"], cases)
    (rule,) = recommend(result)
    assert "case-" not in rule.rule and rule.rule.endswith("[between 4096 and 16384]"), rule.rule
    assert rule.crossovers[0].lower_cases == ["case-4096"]  # still in the JSON


# -- 5: one --json convention


def test_json_alone_prints_to_stdout_and_the_table_goes_to_stderr(archive: str, tmp_path: Path) -> None:
    res = cli("replay", archive, "--selectors", "reference", "--rounds", "1", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["schema"] == "logitreplay.replay/1"
    assert "median" in res.stderr and not Path("-").exists()
    out = tmp_path / "r.json"  # `replay --json FILE` scripts keep working
    assert cli("replay", archive, "--selectors", "reference", "--rounds", "1", "--json", str(out)).exit_code == 0
    assert json.loads(out.read_text())["selectors"] == ["reference"]


def test_card_has_json_and_json_never_writes_over_an_archive(archive: str, tmp_path: Path) -> None:
    res = cli("card", archive, "org/name", "--out", str(tmp_path / "README.md"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["metadata"]["logitreplay"]["cases"] == 2
    res = cli("inspect", "--json", archive)  # --json took the archive as its FILE
    assert res.exit_code == 2 and "is a directory" in res.output
    packed = tmp_path / "p.zip"
    Archive.open(archive).pack(packed)
    before = packed.read_bytes()
    res = cli("inspect", "--json", str(packed), str(packed))
    assert res.exit_code == 2 and "not a JSON file" in res.output and packed.read_bytes() == before


# -- 6: suggestions, loud failures


def test_an_unknown_selector_name_lists_the_names_and_the_closest() -> None:
    res = cli("replay", "--selectors", "refrence")
    assert one_line_error(res)
    assert "did you mean 'reference'?" in res.output and "native" in res.output
    assert "expected 'package.module:factory'" not in res.output


def test_failed_verification_without_strict_ends_with_results_failed(archive: str) -> None:
    res = cli("replay", archive, "--selectors", "reference", "--selector", "tests.plugins:make_duplicate",
              "--rounds", "1")
    assert res.exit_code == 0
    last = res.output.strip().split("\nRESULTS FAILED")[-1]  # the last paragraph, wrapped within 80 columns
    assert "RESULTS FAILED" not in last and "2 failed verification" in last and "(2 cases x 2 selectors)" in last
    assert all(line.startswith("  ") for line in last.splitlines()[1:])


# -- 7: defaults that follow the machine


def test_the_default_device_is_cuda_when_torch_sees_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from logitreplay.cli import replay as replay_cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert replay_cli.default_device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert replay_cli.default_device() == "cpu"


def test_cuda_only_options_on_cpu_say_they_are_ignored(archive: str) -> None:
    res = cli("replay", archive, "--selectors", "reference", "--rounds", "1", "--device", "cpu",
              "--timer", "cupti", "--l2", "cold")
    assert res.exit_code == 0, res.output
    assert "--timer cupti is ignored on CPU" in res.output and "--l2 cold is ignored on CPU" in res.output
    assert res.output.startswith("cpu: ")  # the table says which device
    res = cli("replay", archive, "--selectors", "reference", "--rounds", "1", "--device", "cpu")
    assert "ignored" not in res.output


# -- 8: exports are shareable


def test_exported_safetensors_follow_the_umask(tmp_path: Path) -> None:
    from logitreplay.datasets.export import export_case

    old = os.umask(0o022)
    try:
        path = export_case(plugins.plugin_case(), tmp_path)
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644


# -- 9: the plot


def test_plot_gives_untimed_selectors_their_own_colour_and_a_mark() -> None:
    pytest.importorskip("matplotlib")
    ok = SelectorResult("reference", "ok", timing=Timing([5.0, 6.0], "wall"))
    cases = []
    for cid in ("one", "two"):
        c = CaseResult(cid, 6, 64, 8, "float32", 64, "test", 1000)
        c.results = [ok, SelectorResult("never", "unsupported", "no"),
                     SelectorResult("broken", "failed", "check 1 (range)", [Failure(1, "range", cid, 3, "x")])]
        cases.append(c)
    fig = report.plot_figure(ReplayResult("cpu", "t", TimingProtocol(), {}, "reference",
                                          ["reference", "never", "broken"], cases))
    ax = fig.axes[0]
    legend = {t.get_text(): h for t, h in zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles,
                                              strict=True)}
    colours = [tuple(legend[n].get_facecolor()) for n in ("reference", "never (not timed)", "broken (not timed)")]
    assert len(set(colours)) == 3
    assert {"unsupported", "failed or error"} <= set(legend)
    marks = [line.get_marker() for line in ax.lines]
    assert marks.count("x") == 2 and marks.count("X") == 2  # one per untimed cell
    assert ax.get_xlabel() and all(t.get_horizontalalignment() == "center" for t in ax.get_xticklabels())
    import matplotlib.pyplot as plt

    plt.close(fig)


# -- 10: the smaller points


def test_inspect_bins_the_cases_own_top_k_and_says_rows_are_sampled(tmp_path: Path) -> None:
    # Eight equal top values, then 2000 distinct smaller ones: the top-8 fall into one fp16 bin,
    # a top-2048 into many.
    values = np.concatenate([np.full(8, 100.0), np.linspace(-50, 50, 2000)]).astype(np.float32)
    case = Case.from_rows("k8", values, np.array([0], np.int32), np.array([values.size], np.int32), top_k=8,
                          cols=values.size)
    path = tmp_path / "k8.zarr"
    Archive.create(path).write(case)
    res = cli("inspect", str(path), "--json")
    assert json.loads(res.stdout)["cases"][0]["values"]["fp16_bins_top_mean"] == 1
    table = cli("inspect", str(path)).output
    assert "bins: fp16 bins of the top-k values" in table and "sampled row" in table
    assert "1 case" in table and "1 cases" not in table


def test_an_imported_file_has_one_source_in_replay_and_inspect(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    foreign = tmp_path / "from-elsewhere.safetensors"
    save_file({"logits": torch.randn(4, 16), "ke": torch.full((4,), 16, dtype=torch.int32)}, str(foreign))
    arch = tmp_path / "imp.zarr"
    assert cli("import", str(foreign), "--out", str(arch), "--top-k", "4").output.strip() == \
        f"imported 1 case into {arch}"
    replayed = json.loads(cli("replay", str(arch), "--selectors", "reference", "--rounds", "1", "--json").stdout)
    source = replayed["cases"][0]["source"]
    assert source == "imported from-elsewhere.safetensors"
    assert source in cli("inspect", str(arch), "--wide").output


def test_a_zip_made_with_zip_r_reads(archive: str, tmp_path: Path) -> None:
    zipped = tmp_path / "f.zip"
    with zipfile.ZipFile(zipped, "w") as zf:  # what `zip -r f.zip f.zarr` makes: one folder at the top
        for p in Path(archive).rglob("*"):
            zf.write(p, Path("f.zarr") / p.relative_to(archive))
    assert Archive.open(zipped).case_ids() == Archive.open(archive).case_ids()


def test_an_uncached_hub_model_without_a_network_fails_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    from logitreplay.capture.hf import HFRun, capture_hf
    from logitreplay.errors import CaptureError

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(CaptureError, match="cannot be reached"):
        capture_hf(HFRun(model="no-org/not-cached-model", out=tmp_path / "c", random_tokens=4))


def test_usage_errors_are_one_line() -> None:
    res = cli("replay", "--bogus")
    assert res.exit_code == 2 and one_line_error(res) and "replay --help')" in res.output


def test_ctrl_c_is_one_line_and_silences_the_asyncio_teardown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from logitreplay.datasets import synth

    def interrupted(recipe: object) -> Case:
        raise KeyboardInterrupt

    monkeypatch.setattr(synth, "generate", interrupted)
    asyncio_log = logging.getLogger("asyncio")
    try:
        res = cli("synth", "--out", str(tmp_path / "s.zarr"))
        assert res.exit_code == 130 and res.output.strip() == "interrupted"
        assert asyncio_log.disabled  # "Task was destroyed but it is pending!" is never printed
    finally:
        asyncio_log.disabled = False


def test_only_noisy_timings_are_marked() -> None:
    steady = SelectorResult("a", "ok", timing=Timing([100.0, 101.0, 100.5], "wall"))
    noisy = SelectorResult("b", "ok", timing=Timing([100.0, 300.0, 120.0], "wall"))
    assert report.short_cell(steady) == "100.5" and report.short_cell(noisy) == "120.0~"
