"""`logitreplay replay` end to end through the CLI: the built-in suite, plugins (module:factory and
entry points), broken selectors reported with check and row while good ones still time, the JSON schema
and round trip, CSV and plot outputs, invalid input."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import jsonschema
import pytest
import torch
from click.testing import CliRunner, Result

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.datasets import synth
from logitreplay.replay import results
from logitreplay.replay.results import ReplayResult

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `--selector tests.plugins:...` imports from the repository root

from tests import plugins  # noqa: E402

BROKEN = list(plugins.EXPECTED)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["replay", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def plugin_archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("arch") / "plugins.zarr"
    Archive.create(path).write(plugins.plugin_case())
    return str(path)


@pytest.mark.slow
def test_default_run_verifies_every_builtin_on_every_case(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = run("--rounds", "1", "--json", str(out))
    assert res.exit_code == 0, res.output
    assert "cpu: wall clock of the CPU algorithm models" in res.output
    data = json.loads(out.read_text())
    assert data["selectors"] == ["reference", "native", "deepselect"]
    assert [c["case_id"] for c in data["cases"]] == [r.case_id for r in synth.recipes("seed-controls", "small")]
    for case in data["cases"]:
        assert [r["status"] for r in case["results"]] == ["ok"] * 3, case["case_id"]
    assert "FAILED" not in res.output and "ERROR" not in res.output


def test_broken_selectors_fail_with_check_and_row_while_good_ones_time(plugin_archive: str, tmp_path: Path) -> None:
    specs = [f"tests.plugins:{f}" for f in ["make_good", *BROKEN, "make_raises", "make_factory_raises"]]
    out = tmp_path / "broken.json"
    res = run(plugin_archive, "--selectors", "reference", *[a for s in specs for a in ("--selector", s)],
              "--baseline", "reference", "--json", str(out))
    assert res.exit_code == 0, res.output
    case = json.loads(out.read_text())["cases"][0]
    by_name = {r["selector"]: r for r in case["results"]}
    for name in ("reference", "good"):
        assert by_name[name]["status"] == "ok" and by_name[name]["timing"]["median_us"] > 0
    said = " ".join(res.output.split())  # lines wrapped within 80 columns, read as one text
    for factory, (check, row) in plugins.EXPECTED.items():
        name = getattr(plugins, factory)().name
        r = by_name[name]
        assert r["status"] == "failed", name
        assert (r["failures"][0]["check"], r["failures"][0]["row"]) == (check, row), name
        assert f"FAILED {name}: check {check} (" in said
    assert by_name["raises"]["status"] == "error" and "deliberate failure inside the launch" in by_name["raises"]["reason"]
    factory_error = by_name["tests.plugins:make_factory_raises"]
    assert factory_error["status"] == "error" and "deliberate failure inside the factory" in factory_error["reason"]
    # Every failure and error is also printed in full, with its example.
    assert "check 4 (bounds) failed on case plugins, row 3: wrote 0 at output column 8" in said
    assert "ERROR raises on case plugins: RuntimeError: deliberate failure inside the launch" in said


def test_strict_exits_nonzero_on_failures(plugin_archive: str) -> None:
    assert run(plugin_archive, "--selectors", "reference", "--strict", "--rounds", "1").exit_code == 0
    res = run(plugin_archive, "--selectors", "reference", "--selector", "tests.plugins:make_duplicate", "--strict")
    assert res.exit_code == 1
    assert "--strict: 1 failed" in res.output


def test_entry_point_plugin(plugin_archive: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "site" / "goodplug-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: goodplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[logitreplay.selectors]\ngoodplug = tests.plugins:make_good\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    out = tmp_path / "ep.json"
    res = run(plugin_archive, "--selectors", "reference,goodplug", "--json", str(out), "--rounds", "1")
    assert res.exit_code == 0, res.output
    statuses = [r["status"] for r in json.loads(out.read_text())["cases"][0]["results"]]
    assert statuses == ["ok", "ok"]


def test_json_validates_and_round_trips_and_csv_plot_written(plugin_archive: str, tmp_path: Path) -> None:
    out, table, png = tmp_path / "r.json", tmp_path / "r.csv", tmp_path / "r.png"
    res = run(plugin_archive, "--selector", "tests.plugins:make_wrong_value", "--json", str(out),
              "--csv", str(table), "--plot", str(png))
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    jsonschema.validate(data, results.schema())
    assert ReplayResult.from_json(data).to_json() == data
    assert results.read_json(out) == ReplayResult.from_json(data)
    assert data["environment"]["torch"] and data["protocol"]["timer"] == "wall"
    lines = list(csv.DictReader(table.open()))
    assert [(x["selector"], x["status"]) for x in lines] == [
        ("reference", "ok"), ("native", "ok"), ("deepselect", "ok"), ("wrong-value", "failed")]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schema_rejects_a_malformed_result() -> None:
    bad = {"schema": ReplayResult.SCHEMA, "device": "cpu"}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, results.schema())


def test_nan_case_is_invalid_not_timed(tmp_path: Path) -> None:
    path = tmp_path / "nan.zarr"
    Archive.create(path).write(plugins.plugin_case("with-nan", nan_row=2))
    out = tmp_path / "nan.json"
    res = run(str(path), "--json", str(out))
    assert res.exit_code == 0, res.output
    case = json.loads(out.read_text())["cases"][0]
    assert case["invalid"] == "NaN inside row 2" and case["results"] == []
    assert "invalid: case with-nan: NaN inside row 2" in res.output
    assert run(str(path), "--strict").exit_code == 1


@pytest.mark.parametrize("args, message", [
    (["does-not-exist.zarr"], "does-not-exist.zarr: no such file or directory"),
    (["--selectors", "reference,nosuchselector"], "nosuchselector"),
    (["--selector", "tests.plugins:make_nothing"], "has no attribute 'make_nothing'"),
    (["--poison", "banana"], "neither a number nor 'nan'"),
])
def test_unusable_input_is_a_one_line_error(args: list[str], message: str) -> None:
    res = CliRunner().invoke(main, ["replay", *args])
    assert res.exit_code != 0
    assert message in res.output
    assert "Traceback" not in res.output


def test_captured_case_source_and_fast_path() -> None:
    from logitreplay.replay.fast_path import fast_path
    from logitreplay.replay.sources import describe_source

    case = plugins.plugin_case()
    case.attrs = {"model": "/models/tiny-dsv32", "layer_index": 3, "chunk": {"requests": 1}}
    assert describe_source(case) == "tiny-dsv32 layer 3"
    assert fast_path(case) == (False, "rows start past column 0")
    case.row_starts[:] = 0
    case.row_stride = 256  # 1024 bytes of float32
    assert fast_path(case) == (True, "")
    case.attrs["chunk"] = {"requests": 2}
    assert fast_path(case) == (False, "2 requests")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_is_a_one_line_error() -> None:
    res = CliRunner().invoke(main, ["replay", "--device", "cuda"])
    assert res.exit_code == 1
    assert "torch sees no CUDA device" in res.output and "Traceback" not in res.output


def test_inspect_work_shows_native_and_split_needing_more_passes_on_concentrated_values(tmp_path: Path) -> None:
    """Rows long enough (8192) that the first fp16 threshold bin of +100 / *1e-8 scores exceeds 2048, and
    split's coarse bucket its shared-memory list; rows enough (140) that split keeps each whole, so that it
    lists a normal row's bucket."""
    path = tmp_path / "ablation.zarr"
    archive = Archive.create(path)
    for dist in ("normal", "normal+100", "normal*1e-8"):
        archive.write(synth.generate(synth.Recipe("test", "b", dist, 140, 8192, 512, "causal", 200)))
    res = CliRunner().invoke(main, ["inspect", str(path), "--work", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    work = {c["distribution"]: c["work"] for c in json.loads(res.output)["cases"]}
    normal = work["normal"]["native_passes_max"]
    assert work["normal+100"]["native_passes_mean"] > normal and work["normal*1e-8"]["native_passes_mean"] > normal
    # DeepSelect's work does not depend on the distribution.
    assert len({w["deepselect_compactions_mean"] for w in work.values()}) == 1
    assert work["normal"]["split_listed_mean"] > 0.5
    for dist in ("normal+100", "normal*1e-8"):
        assert work[dist]["split_listed_mean"] == 0
        assert work[dist]["split_rounds_mean"] > work["normal"]["split_rounds_mean"]
    table = CliRunner().invoke(main, ["inspect", str(path), "--work", "--wide"], catch_exceptions=False).output
    assert "native passes" in table and "3.00 / 3" in table and "split listed" in table
