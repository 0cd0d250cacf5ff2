"""bench/deepselect_ab.py, the before/after harness of a deepselect change: a variant's sources come from
the revision it names (the headers of that revision too), each prepared variant is a selector column of
its own, ptxas's resource report is read per kernel class, and the table divides by the named base."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from logitreplay.selectors import build
from logitreplay.selectors.cuda import build as cuda_build

ROOT = Path(__file__).resolve().parents[1]
BEFORE_CONFIG = "98d3233"  # the last deepselect.cu without deepselect_config.h

# What ptxas prints for two functions with --resource-usage (the format of nvcc 13.0): a kernel
# instantiation, and a device function that is not a kernel (left out of the report).
PTXAS = """\
ptxas info    : Compiling entry function '_ZN12_GLOBAL__N_117deepselect_kernelIfLi512ELb1EEEvPKT_x' for 'sm_90a'
ptxas info    : Function properties for _ZN12_GLOBAL__N_117deepselect_kernelIfLi512ELb1EEEvPKT_x
    16 bytes stack frame, 20 bytes spill stores, 60 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 16 bytes cumulative stack size
ptxas info    : Function properties for _ZN12_GLOBAL__N_110DeepSelectIfLi512ELb1EE5rebetERNS1_4SmemEiiiif
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Function properties for _ZN12_GLOBAL__N_117deepselect_kernelI13__nv_bfloat16Li2048ELb0EEEvPKT_x
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 79 registers, used 1 barriers
"""


@pytest.fixture
def ab(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.chdir(ROOT)  # the revisions are read with git from the checkout
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("LR_DS_VARIANTS", str(tmp_path / "variants"))
    import bench.deepselect_ab as module

    return module


def test_a_variant_takes_every_source_from_its_revision(ab, tmp_path: Path) -> None:
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout")
    ab.prepare(["head=HEAD", "tree=."], tmp_path / "variants")
    if subprocess.run(["git", "cat-file", "-e", f"{BEFORE_CONFIG}^{{commit}}"], cwd=ROOT).returncode == 0:
        ab.prepare([f"before={BEFORE_CONFIG}"], tmp_path / "variants")
        before = json.loads((tmp_path / "variants" / "before" / "source.json").read_text())
        assert set(before["sha256"]) == set(ab.FILES) - set(ab.OPTIONAL)  # its constants were in the .cu
    for f in ab.FILES:
        show = ["git", "show", f"HEAD:{ab.KERNEL_DIR}/{f}"]
        committed = subprocess.run(show, cwd=ROOT, capture_output=True, check=True).stdout
        assert (tmp_path / "variants" / "head" / f).read_bytes() == committed
        assert (tmp_path / "variants" / "tree" / f).read_bytes() == (cuda_build.SOURCE_DIR / f).read_bytes()
    head = json.loads((tmp_path / "variants" / "head" / "source.json").read_text())
    assert head["revision"] == "HEAD" and head["commit"] and len(head["sha256"]["deepselect.cu"]) == 64
    tree = json.loads((tmp_path / "variants" / "tree" / "source.json").read_text())
    assert tree["commit"] == "working tree"


def test_each_prepared_variant_is_a_column_of_its_own_and_others_are_unknown(ab, tmp_path: Path) -> None:
    ab.prepare(["mine=."], tmp_path / "variants")
    sel = build("bench.deepselect_ab:mine")
    assert sel.name == "deepselect@mine"
    assert sel.note(None).startswith(  # type: ignore[attr-defined]
        "deepselect.cu of . (working tree), sha256 ")
    assert sel.supports(None, torch.device("cpu")) == (  # type: ignore[arg-type]
        "a CUDA kernel: needs a CUDA device")
    with pytest.raises(AttributeError):
        ab.__getattr__("absent")


def test_ptxas_report_is_read_per_kernel_class(ab) -> None:
    assert ab.resource_usage(PTXAS) == {
        "bf16 k2048": {"registers": 79, "stack": 0, "spill_stores": 0, "spill_loads": 0},
        "fp32 k512 wide": {"registers": 64, "stack": 16, "spill_stores": 20, "spill_loads": 60},
    }


def test_table_divides_each_column_by_the_base(ab, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    def result(selector: str, us: float) -> dict:
        return {"selector": selector, "status": "ok", "failures": [], "timing": {"median_us": us}}

    report = {"cases": [{"case_id": "a-normal-c8192-r4096-k512", "dtype": "bfloat16",
                         "results": [result("deepselect@old", 100.0), result("deepselect@new", 80.0),
                                     {**result("deepselect-upstream", 90.0), "failures": ["wrong"]}]}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    ab.table([path], "deepselect@old")
    out = capsys.readouterr().out
    assert "a-normal-c8192-r4096-k512 bfloat16" in out and "80.0 x0.80" in out
    assert "90.0" not in out  # a result that failed verification has no time


def test_a_pair_of_columns_gets_its_own_ratio_and_a_missing_time_is_a_dash(ab, tmp_path: Path) -> None:
    def result(selector: str, us: float) -> dict:
        return {"selector": selector, "status": "ok", "failures": [], "timing": {"median_us": us}}

    report = {"cases": [
        {"case_id": "one", "dtype": "float32",
         "results": [result("deepselect@old", 100.0), result("deepselect@new", 80.0), result("deepselect-upstream", 64.0)]},
        {"case_id": "two", "dtype": "float32", "results": [result("deepselect@old", 50.0), result("deepselect@new", 40.0)]}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    head, rows = ab.ratios(path, "deepselect@old", [("deepselect@new", "deepselect-upstream")])
    assert head == ["case", "deepselect@old", "deepselect@new", "deepselect-upstream",
                    "deepselect@new / deepselect-upstream"]
    assert rows == [["one", "100.0", "80.0 x0.80", "64.0 x0.64", "1.25"], ["two", "50.0", "40.0 x0.80", "-", "-"]]


def test_a_variant_named_as_one_of_the_modules_own_functions_is_refused(ab, tmp_path: Path) -> None:
    """`bench.deepselect_ab:main` would load the module's CLI entry point, not a variant called main."""
    with pytest.raises(SystemExit, match="'main': a name of this module's own"):
        ab.prepare(["main=."], tmp_path / "variants")
    assert not (tmp_path / "variants" / "main").exists()
