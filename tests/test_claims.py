"""bench/claims.py, which renders every figure table of the documents from the committed results: the
committed documents are what their data renders, rendering is deterministic, `--check` fails on a
hand-edited figure (and `make claims` puts it back), and every marked block has a renderer."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def claims() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))  # as `python bench/claims.py` sees its sibling scripts
    import claims

    return claims


@pytest.fixture
def tree(claims: ModuleType, tmp_path: Path) -> Path:
    """A copy of the documents, the committed results and the kernels' sources, to edit."""
    for rel in claims.DOCUMENTS:
        if (ROOT / rel).is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, tmp_path / rel)
    shutil.copytree(ROOT / claims.RESULTS, tmp_path / claims.RESULTS)
    shutil.copytree(ROOT / claims.SELECTORS, tmp_path / claims.SELECTORS,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_committed_documents_are_what_their_data_renders(claims: ModuleType) -> None:
    assert claims.run(ROOT, check=True) == []


def test_rendering_is_deterministic(claims: ModuleType, tree: Path) -> None:
    for rel in claims.DOCUMENTS:
        if (tree / rel).is_file():
            text = (tree / rel).read_text()
            assert claims.render_text(text, tree, rel) == claims.render_text(text, tree, rel)


def test_check_fails_on_a_hand_edited_figure_and_claims_puts_it_back(claims: ModuleType, tree: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    readme = tree / "README.md"
    committed = readme.read_text()
    start = committed.index("<!-- claims: readme-h200 -->")
    figure = "| 146.1 |"
    at = committed.index(figure, start)
    readme.write_text(committed[:at] + "| 126.1 |" + committed[at + len(figure):])
    assert claims.main(["--check", "--root", str(tree)]) == 1
    err = capsys.readouterr().err
    assert "README.md" in err and "126.1" in err and "146.1" in err
    assert claims.main(["--root", str(tree)]) == 0
    assert readme.read_text() == committed
    assert claims.main(["--check", "--root", str(tree)]) == 0


def test_check_fails_when_the_data_changes(claims: ModuleType, tree: Path) -> None:
    path = tree / claims.RESULTS / claims.H200_FP32
    path.write_text(path.read_text().replace('"median_us": 146.', '"median_us": 136.', 1))
    assert claims.run(tree, check=True)


def test_prose_outside_the_blocks_is_left_as_written(claims: ModuleType, tree: Path) -> None:
    readme = tree / "README.md"
    text = readme.read_text().replace("## Commands", "## Commands (hand-edited heading)")
    readme.write_text(text)
    assert claims.main(["--root", str(tree)]) == 0
    assert readme.read_text() == text


def test_every_marked_block_has_a_renderer_and_every_renderer_a_block(claims: ModuleType) -> None:
    used = set()
    for rel in claims.DOCUMENTS:
        if (ROOT / rel).is_file():
            names = claims.blocks((ROOT / rel).read_text())
            assert set(names) <= set(claims.RENDERERS), rel
            used.update(names)
    assert used == set(claims.RENDERERS)


def test_an_unknown_or_unpaired_block_is_refused(claims: ModuleType, tree: Path) -> None:
    with pytest.raises(claims.ClaimsError, match="no renderer"):
        claims.render_text("x\n<!-- claims: no-such-table -->\n<!-- /claims -->\n", tree)
    with pytest.raises(claims.ClaimsError, match="without its pair"):
        claims.render_text("x\n<!-- claims: readme-h200 -->\nno end marker\n", tree)


def test_a_renderer_no_document_uses_fails_the_check(claims: ModuleType, tree: Path) -> None:
    readme = tree / "README.md"
    text = readme.read_text()
    start = text.index("<!-- claims: readme-rule -->")
    end = text.index("<!-- /claims -->", start) + len("<!-- /claims -->")
    readme.write_text(text[:start] + text[end:])
    assert any("readme-rule" in p and "no document" in p for p in claims.run(tree, check=True))


def test_a_table_states_its_command_hardware_and_date(claims: ModuleType) -> None:
    out = claims.RENDERERS["readme-h200"](ROOT)
    assert "2026-12-02" in out and "NVIDIA H200" in out and "logitreplay replay --device cuda" in out
    with pytest.raises(claims.ClaimsError, match="no command recorded"):
        claims.source(ROOT, "h200-2026-12-02/not-a-run.json")


def test_a_run_without_source_digests_is_marked_as_measured_on_an_older_kernel(claims: ModuleType) -> None:
    """Every committed run before the digests: its tables say so rather than pass as the tree's kernels;
    results no kernel made carry no mark."""
    assert "Measured on an older kernel / kernel sources not recorded" in claims.RENDERERS["readme-h200"](ROOT)
    assert "older kernel" not in claims.RENDERERS["codecs"](ROOT)


def test_check_fails_when_a_kernel_source_changes_after_its_run(claims: ModuleType, tree: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A run that recorded the tree's digests renders unmarked; editing one kernel's source (deepselect.cu)
    makes `--check` fail on every table of that run, and the rendered table names the stale kernel. A
    kernel the run did not use (split) may change without marking it."""
    import json

    from logitreplay.selectors import provenance

    data = tree / claims.RESULTS / claims.H200_FP32
    report = json.loads(data.read_text())
    report["environment"]["kernel_sources"] = provenance.kernel_sources("cuda", tree / claims.SELECTORS)
    data.write_text(json.dumps(report))
    assert claims.main(["--root", str(tree)]) == 0
    readme = tree / "README.md"
    assert "older kernel" not in readme.read_text().split("<!-- claims: readme-h200 -->")[1].split("<!-- /")[0]
    assert claims.main(["--check", "--root", str(tree)]) == 0

    split = tree / claims.SELECTORS / "cuda/split.cu"
    split.write_text(split.read_text() + "\n// a change to a kernel this run did not time\n")
    claims.tree_digests.cache_clear()
    assert claims.main(["--root", str(tree)]) == 0  # the runs that timed split (bench/PEERS.md's) are marked
    assert "older kernel" not in readme.read_text().split("<!-- claims: readme-h200 -->")[1].split("<!-- /")[0]
    assert claims.main(["--check", "--root", str(tree)]) == 0

    kernel = tree / claims.SELECTORS / "cuda/deepselect.cu"
    kernel.write_text(kernel.read_text().replace("#include", "// edited after the run\n#include", 1))
    claims.tree_digests.cache_clear()
    assert claims.main(["--check", "--root", str(tree)]) == 1
    assert "Measured on an older kernel**: the sources of deepselect (sha256:" in capsys.readouterr().err
    assert claims.main(["--root", str(tree)]) == 0
    block = readme.read_text().split("<!-- claims: readme-h200 -->")[1].split("<!-- /")[0]
    assert "Measured on an older kernel**: the sources of deepselect" in block and "native (" not in block
    claims.tree_digests.cache_clear()


def test_an_indexer_fidelity_run_renders_with_one_mapping_edit(claims: ModuleType, tree: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Naming a bench/fidelity_gpu.sh indexer run's results folder in FIDELITY_RUNS renders each suite's
    table (and only that suite's) with its source lines."""
    import json

    doc = tree / "bench/FIDELITY.md"
    folder = tree / claims.RESULTS / "h200-2099-01-01"
    folder.mkdir()
    lib = "@$VLLM_LIBS/_C_stable_libtorch.abi3.so"
    env = {"gpu": "NVIDIA H200", "sm_count": 132, "driver": "580.159.04", "cuda_runtime": "13.0", "torch": "2.11.0"}

    def result(selector: str, us: float) -> dict[str, object]:
        return {"selector": selector, "status": "ok", "reason": None, "timing": {"median_us": us}}

    prefill = {"case_id": "v32-indexer-c8192-r2048-k2048", "rows": 2048, "top_k": 2048, "dtype": "float32",
               "kind": "prefill", "results": [result("native", 63.0), result("vllm-native" + lib, 70.0)]}
    decode = {"case_id": "v32-indexer-c163840-b8-n1-k2048-long", "rows": 8, "top_k": 2048, "dtype": "float32",
              "kind": "decode", "results": [result("split", 23.0), result("vllm-cooperative" + lib, 21.8)]}
    for name, case in (("indexer", prefill), ("indexer-decode", decode)):
        (folder / f"{name}.json").write_text(json.dumps({"cases": [case], "environment": env}))
    (folder / "copy.json").write_text(json.dumps({"2048x2048": 7.0, "8x2048": 1.8}))
    (folder / "commands.json").write_text(json.dumps({
        "indexer.json": "logitreplay replay --suite indexer --scale full",
        "indexer-decode.json": "logitreplay replay --suite indexer-decode --scale full",
        "copy.json": "python bench/fidelity.py --suites indexer,indexer-decode"}))
    monkeypatch.setitem(claims.FIDELITY_RUNS, "indexer", "h200-2099-01-01")
    monkeypatch.setitem(claims.FIDELITY_RUNS, "indexer-decode", "h200-2099-01-01")
    assert claims.main(["--root", str(tree)]) == 0
    text = doc.read_text()
    block = text[text.index("<!-- claims: fidelity-indexer -->"):text.index("<!-- claims: fidelity-indexer-decode -->")]
    assert "| indexer | v32-indexer-c8192-r2048-k2048 | 63.0 | 70.0 | 7.0 | 1.000 |" in block
    assert "Data: `bench/results/h200-2099-01-01/indexer.json` (2099-01-01, NVIDIA H200" in block
    assert "indexer-decode.json" not in block and "Decode shapes" not in block
    decode_block = text[text.index("<!-- claims: fidelity-indexer-decode -->"):]
    decode_block = decode_block[:decode_block.index("<!-- /claims -->")]
    assert "| 1.8 | 20.0 | 1.15 |" in decode_block and "Misses" in decode_block and "none." in decode_block
    assert "Data: `bench/results/h200-2099-01-01/copy.json`" in decode_block
    assert claims.main(["--check", "--root", str(tree)]) == 0


def test_auto_is_scored_per_case_with_what_decided_it_and_a_slow_choice_is_a_miss(claims: ModuleType) -> None:
    """targets.auto_vs_fastest, on the committed replay of `auto` on `indexer`: each case names the feature
    or width that decided it; a choice made 20% slower than the fastest is a miss, and so is a suite
    with fewer than 90% of its cases within 3%."""
    import copy

    import targets

    report = claims.load(ROOT, f"{claims.AUTO_RUNS}/auto-indexer.json")
    rows, misses = targets.auto_vs_fastest(report)
    assert misses == [] and rows[-1][0] == "**within 3%: 9 of 9**"
    assert any("bin_load" in r[2] for r in rows) and any("cols <" in r[2] for r in rows)
    slowed = copy.deepcopy(report)
    for case in slowed["cases"][:2]:
        auto = next(r for r in case["results"] if r["selector"] == "auto")
        auto["timing"]["samples_us"] = [x * 1.2 for x in auto["timing"]["samples_us"]]
    rows, misses = targets.auto_vs_fastest(slowed)
    assert rows[-1][0] == "**within 3%: 7 of 9**"
    assert [m.split(":")[0] for m in misses[:2]] == [c["case_id"] for c in slowed["cases"][:2]]
    assert misses[2] == "within 3% on 7 of 9 cases"


def test_each_deterministic_mode_is_scored_against_its_own_default_and_only_bundled_ones_miss(claims: ModuleType) -> None:
    """targets.det_cost: `NAME-det[@FOLDER]` pairs with `NAME[@FOLDER]` (a staged release's deterministic
    call with the same release's default); a bundled mode above 1.15x its default on a case is a miss, a
    peer's is reported without one."""
    import targets

    def case(times: dict[str, float]) -> dict[str, object]:
        return {"results": [{"selector": n, "status": "ok", "timing": {"median_us": t}} for n, t in times.items()]}

    names = ["split", "split-det", "flashinfer-paged@fi", "flashinfer-paged-det@fi", "flashinfer-ragged-det@fi",
             "cudnn-indexer-topk-det"]
    report = {"selectors": names, "cases": [
        case({"split": 20.0, "split-det": 22.0, "flashinfer-paged@fi": 10.0, "flashinfer-paged-det@fi": 20.0}),
        case({"split": 20.0, "split-det": 40.0, "flashinfer-paged@fi": 10.0, "flashinfer-paged-det@fi": 11.0})]}
    assert targets.det_pairs(names) == [("split-det", "split"), ("flashinfer-paged-det@fi", "flashinfer-paged@fi")]
    rows, misses = targets.det_cost(report)
    assert rows == [["split-det", "2", "1.10 / 1.55 / 2.00", "1 of 2", "2.0 to 20.0"],
                    ["flashinfer-paged-det@fi", "2", "1.10 / 1.55 / 2.00", "1 of 2", "1.0 to 10.0"]]
    assert misses == ["split-det: 1 of 2 cases above 1.15x"]


def test_the_fastest_bundled_kernel_is_held_to_the_read_floor_of_long_rows_and_prefill_chunks(
        claims: ModuleType) -> None:
    """targets.bundled_vs_production: a case of 2^18 columns or more (prefill or decode) misses above 1.3x
    its read floor, a prefill chunk of 25,600-163,840 columns above 1.5x, and a 163,840-wide decode batch
    has no floor target; a production peer faster than every bundled kernel is a miss on a decode batch
    (issue 41's target), not on a prefill chunk."""
    import targets

    def case(cid: str, cols: int, kind: str, floor: float, times: dict[str, float]) -> dict[str, object]:
        return {"case_id": cid, "cols": cols, "kind": kind, "floor_us": floor,
                "results": [{"selector": n, "status": "ok", "timing": {"median_us": t}} for n, t in times.items()]}

    report = {"cases": [case("long", 1 << 20, "decode", 10.0, {"split": 14.0, "vllm-persistent@v": 15.0}),
                        case("long-ok", 262144, "prefill", 10.0, {"deepselect": 12.9, "sglang-ragged-v2": 13.0}),
                        case("chunk", 102400, "prefill", 10.0, {"deepselect": 14.0, "native": 16.0,
                                                                  "sglang-ragged-v2": 13.0}),
                        case("batch", 163840, "decode", 10.0, {"split": 40.0, "vllm-persistent@v": 30.0})]}
    rows, misses = targets.bundled_vs_production(report)
    assert [r[-1] for r in rows] == ["1.4 **miss**", "1.3", "1.4", "4.0"]
    assert [r[-2] for r in rows] == ["0.93", "0.99", "1.08", "1.33 **miss**"]
    assert misses == ["long: split 1.40x its read floor (target 1.3)", "batch: split 1.33x vllm-persistent@v"]


def test_the_bundled_deepselect_misses_where_upstream_deepselect_is_faster(claims: ModuleType) -> None:
    """targets.deepselect_vs_upstream: only cases where both verified are scored, and a case where the
    bundled kernel is slower than upstream's is a miss (issue 43)."""
    import targets

    def case(cid: str, times: dict[str, float], failed: str = "") -> dict[str, object]:
        return {"case_id": cid, "dtype": "bfloat16", "results": [
            {"selector": n, "status": "failed" if n == failed else "ok", "timing": {"median_us": t}}
            for n, t in times.items()]}

    report = {"cases": [case("a", {"deepselect": 9.0, "deepselect-upstream": 10.0}),
                        case("b", {"deepselect": 12.0, "deepselect-upstream": 10.0}),
                        case("c", {"deepselect": 12.0, "deepselect-upstream": 10.0}, failed="deepselect-upstream")]}
    rows, misses = targets.deepselect_vs_upstream(report)
    assert [r[-1] for r in rows] == ["0.90", "1.20 **miss**"]
    assert misses == ["b: deepselect 1.20x upstream"]


def test_split_s_waves_come_from_its_plan_over_the_case_s_bounds(claims: ModuleType) -> None:
    """targets.split_waves: each decode case's items are split_plan's over the recipe's bounds (one row
    of a single 160K row: its keys over the grid less the row, at least kMinChunk each), per block, beside
    split's time and the fastest production kernel's; split slower than it is listed."""
    import targets

    from logitreplay.datasets import synth
    from logitreplay.selectors import cpu_models

    recipe = next(r for r in synth.recipes("indexer-decode", "full") if r.case_id.endswith("b1-n1-k2048-long"))
    starts, ends = synth.bounds(recipe)
    keys = int((ends - starts).sum())
    case = {"case_id": recipe.case_id, "rows": 1, "top_k": 2048, "dtype": "float32", "results": [
        {"selector": n, "status": "ok", "timing": {"median_us": t}}
        for n, t in {"split": 22.0, "vllm-persistent@v": 20.0}.items()]}
    rows, misses = targets.split_waves({"cases": [case]}, "indexer-decode")
    items = -(-keys // max(-(-keys // (cpu_models.SPLIT_GRID - 1)), cpu_models.SPLIT_MIN_CHUNK))  # grid less its row
    assert rows == [[recipe.case_id, "1", f"{keys / 1e6:.1f}", str(items), f"{items / cpu_models.SPLIT_GRID:.2f}",
                     "22.0", "20.0", "1.10 **slower**"]]
    assert misses == [f"{recipe.case_id}: split 1.10x vllm-persistent@v"]


def test_the_ab_table_names_each_revision_and_marks_a_tree_column_the_tree_has_left(claims: ModuleType,
                                                                                   tree: Path) -> None:
    """bench/deepselect_gpu.sh's A/B: each column's deepselect.cu is named; the `tree` column is the tree's
    kernel only while deepselect's sources (its headers too) are what the run built, and a column that
    failed to load is said so."""
    claims.tree_digests.cache_clear()
    block = claims.RENDERERS["deepselect-ab-2026-12-05"](tree)
    assert "deepselect@pre-rebet: deepselect.cu of 08912d3^ (171a031)" in block and "older kernel" not in block
    assert "No time (the column failed to load): bench.deepselect_ab:main" in block
    for source in ("cuda/common.cuh", "cuda/deepselect.cu"):
        kernel = tree / claims.SELECTORS / source
        text = kernel.read_text()
        kernel.write_text(text + "\n// edited after the run\n")
        claims.tree_digests.cache_clear()
        assert "Measured on an older kernel**: the sources of deepselect (" in (
            claims.RENDERERS["deepselect-ab-2026-12-05"](tree))
        kernel.write_text(text)
