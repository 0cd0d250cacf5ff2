"""bench/peers.py's columns and bench/PEERS.md's headers, derived from the declarations: every adapter once
per staged release it takes (vLLM 0.33 and 0.34, FlashInfer 0.7.2.post1 and 0.7.4 side by side, each in a
column named after its folder), on the installed package when none of its package's releases is staged;
a release an adapter was not read from gives it no column; each header states the version its verified
results ran from. A staged release folder is a namespace package beside its `*.dist-info`, found and
versioned by the kit like any folder."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from logitreplay.selectors.upstream import catalog, loading
from logitreplay.selectors.upstream.base import note_version

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "peers.py"
RELEASES = {"vllm-0.33.0": "vllm-0.33.0", "vllm-0.34.0": "vllm-0.34.0",
            "flashinfer-0.7.2.post1": "flashinfer_python-0.7.2.post1", "flashinfer-0.7.4": "flashinfer_python-0.7.4",
            "sglang-kernel-0.4.6": "sglang_kernel-0.4.6"}


@pytest.fixture(scope="module")
def peers() -> ModuleType:
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("peers", SCRIPT)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(SCRIPT.parent))


@pytest.fixture
def staged(tmp_path: Path) -> Path:
    for folder, info in RELEASES.items():
        (tmp_path / folder / f"{info}.dist-info").mkdir(parents=True)
    (tmp_path / "notes").mkdir()  # no release in it: not a source
    return tmp_path


def _on(name: str, folder: str, root: Path) -> str:
    return f"{name}@{root / folder}"


def test_each_adapter_gets_a_column_per_staged_release_it_takes(peers: ModuleType, staged: Path) -> None:
    cols = peers.columns(staged)
    for name in ("vllm-native", "vllm-decode", "vllm-persistent", "vllm-deepselect"):  # 0.34 kept 0.33's ops
        assert [c for c in cols if c.startswith(f"{name}@")] == [_on(name, "vllm-0.33.0", staged),
                                                                  _on(name, "vllm-0.34.0", staged)]
    for name in ("vllm-cooperative", "vllm-auto"):
        assert [c for c in cols if c.startswith(f"{name}@")] == [_on(name, "vllm-0.33.0", staged)]
    for name in ("vllm034-cooperative", "vllm034-auto"):
        assert [c for c in cols if c.startswith(f"{name}@")] == [_on(name, "vllm-0.34.0", staged)]
    for name in ("flashinfer", "flashinfer-ragged", "flashinfer-paged-cub", "flashinfer-topk"):
        assert [c for c in cols if c.startswith(f"{name}@")] == [_on(name, "flashinfer-0.7.2.post1", staged),
                                                                  _on(name, "flashinfer-0.7.4", staged)]
    assert [c for c in cols if c.startswith("flashinfer-ragged-det")] == [
        _on("flashinfer-ragged-det", "flashinfer-0.7.4", staged)]
    assert _on("sgl-fast-topk", "sglang-kernel-0.4.6", staged) in cols
    # packages with no staged release keep one column on what is installed
    for name in ("sglang-ragged-v2", "cudnn-indexer-topk", "deepselect-upstream"):
        assert name in cols
    assert not {"vllm-native", "flashinfer-ragged", "sgl-fast-topk"} & set(cols)
    assert not [c for c in cols if "notes" in c]


def test_without_staged_releases_every_adapter_has_its_installed_column(peers: ModuleType, tmp_path: Path) -> None:
    assert peers.columns(None) == list(catalog.adapters()) == list(peers.PEERS)
    assert peers.columns(tmp_path / "absent") == list(catalog.adapters())


def test_a_staged_release_no_adapter_was_read_from_gives_no_column(peers: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "vllm-0.36.0" / "vllm-0.36.0.dist-info").mkdir(parents=True)
    cols = peers.columns(tmp_path)
    assert not [c for c in cols if c.startswith("vllm")]  # each would only say it refuses 0.36.0
    assert "flashinfer-ragged" in cols


def test_versions_lists_what_each_staged_folder_holds(peers: ModuleType, staged: Path) -> None:
    found = peers.versions(staged)
    assert found["vllm-0.34.0"] == "vllm 0.34.0"
    assert found["flashinfer-0.7.4"] == "flashinfer_python 0.7.4"
    assert "vllm" not in found and "sgl_kernel" not in found  # every release of theirs is staged


def _result(selector: str, us: float | None, reason: str | None, status: str = "ok") -> dict[str, Any]:
    return {"selector": selector, "status": status, "reason": reason,
            "timing": None if us is None else {"median_us": us}}


def test_each_header_states_the_version_its_results_ran_from(peers: ModuleType, tmp_path: Path) -> None:
    v33, v34 = "vllm-native@vllm-0.33.0", "vllm-native@vllm-0.34.0"
    results = [
        _result("split", 20.0, None),
        _result(v33, 30.0, "top_k_per_row_prefill from /s/vllm-0.33.0 (0.33.0); staging copy 8 B"),
        _result(v34, 29.0, "top_k_per_row_prefill from /s/vllm-0.34.0 (0.34.0); staging copy 8 B"),
        _result("flashinfer-ragged", 25.0, "flashinfer.top_k_ragged_transform (radix), SGLang's call on shuffled "
                                           "offsets from flashinfer (0.7.2.post1); staging copy 8 B"),
        _result("sgl-fast-topk", 24.0, "torch.ops.sgl_kernel.fast_topk from sgl_kernel (0.4.6); staging copy 8 B"),
        _result("vllm-deepselect@vllm-0.34.0", None, "no sm_90 code in vllm._deepselect_C (it has sm_100)",
                "unsupported"),
        _result("cudnn-indexer-topk", 40.0, "IndexerTopK from cudnn (version unknown); staging copy 8 B"),
    ]
    report = {"cases": [{"case_id": "decode-b8", "results": results}], "environment": {"gpu": "GPU X"}}
    (tmp_path / f"{peers.PREFIX}decode.json").write_text(json.dumps(report))
    (tmp_path / f"{peers.PREFIX}commands.json").write_text(json.dumps({"decode": "logitreplay replay --suite decode"}))
    md = tmp_path / "PEERS.md"
    peers.report(tmp_path, md, None)
    head = next(line for line in md.read_text().splitlines() if line.startswith("| case |"))
    assert head == ("| case | split | vllm-native@vllm-0.33.0 | vllm-native@vllm-0.34.0 | flashinfer-ragged (0.7.2.post1) "
                    "| sgl-fast-topk (0.4.6) | vllm-deepselect@vllm-0.34.0 | cudnn-indexer-topk |")
    assert "| decode-b8 | 20.0 | 30.0 | 29.0 | 25.0 | 24.0 | n/a | 40.0 |" in md.read_text()
    assert "- `vllm-deepselect@vllm-0.34.0`: no sm_90 code" in md.read_text()
    assert peers.suite_block(report).splitlines()[2] == head  # what `make claims` renders into bench/PEERS.md


def _rerun(selector: str, status: str = "ok", *, same_sets: bool = True, same_order: bool = True,
           policy: str | None = None, recall: float | None = None) -> dict[str, Any]:
    r = _result(selector, 10.0 if status == "ok" else None, None, status)
    if status == "ok":
        r["determinism"] = {"runs": 6, "deterministic": same_sets and same_order, "same_sets": same_sets,
                            "same_order": same_order, "distinct_sets": 1 if same_sets else 2, "first_row": None}
    r["tie_policy"] = policy
    r["damage"] = None if recall is None else {"recall_min": recall, "recall_mean": recall, "rows": 1, "of_rows": 2,
                                               "max_deficit": 0.5}
    return r


def test_the_right_table_states_per_selector_determinism_ties_agreement_and_recall(peers: ModuleType) -> None:
    ties = {"case_id": "ties", "results": [
        _rerun("native", same_order=False, policy="highest"), _rerun("native-det", policy="lowest"),
        _rerun("split", same_sets=False, same_order=False, policy="none observed"),
        _rerun("sgl-fast-topk", "failed", recall=0.25), _rerun("vllm-deepselect@vllm-0.34.0", "unsupported")],
        "agreement": [{"a": "native", "b": "native-det", "rows": 0.004}, {"a": "native-det", "b": "split", "rows": 0.999}]}
    plain = {"case_id": "plain", "results": [
        _rerun("native", same_order=False), _rerun("native-det"), _rerun("split", same_order=False),
        _rerun("sgl-fast-topk", "failed", recall=0.5), _rerun("vllm-deepselect@vllm-0.34.0", "unsupported")],
        "agreement": [{"a": "native", "b": "native-det", "rows": 1.0}, {"a": "native-det", "b": "split", "rows": 1.0}]}
    block = peers.suite_block({"cases": [ties, plain]})
    assert peers.RIGHT_LEGEND in block
    rows = block[block.index("| selector |"):].splitlines()
    assert rows[2:7] == [
        "| native | 2 of 2 | 0 | no: order in 2 of 2 | highest (1) | 0.00 (1 of 2 below 1) | - |",
        "| native-det | 2 of 2 | 0 | yes (2) | lowest (1) | (reference) | - |",
        # a case with 0.999 of its rows agreeing reads 0.99, never 1.00
        "| split | 2 of 2 | 0 | no: order in 1, sets in 1 of 2 | none observed (1) | 0.99 (1 of 2 below 1) | - |",
        "| sgl-fast-topk | 0 of 2 | 0 | - | - | - | 0.250 (2 cases) |",
        "| vllm-deepselect@vllm-0.34.0 | - | 2 | - | - | - | - |"]


def test_a_report_without_reruns_renders_no_right_table(peers: ModuleType) -> None:
    report = {"cases": [{"case_id": "c", "results": [_result("native", 10.0, None)]}]}
    assert peers.right_table(report) == []
    assert "| selector |" not in peers.suite_block(report)


def test_a_note_states_its_version_and_nothing_else_is_read_as_one() -> None:
    assert note_version("vLLM 0.34 chose cooperative_topk from /s/vllm-0.34.0 (0.34.0); staging copy 1 B") == "0.34.0"
    assert note_version("topk into the view (aligned), else staged from vllm (0.33.0); staging copy at most 4 B") == \
        "0.33.0"
    assert note_version("x from y (version unknown); staging copy 1 B") is None
    assert note_version("flashinfer.top_k (radix) from flashinfer; staging copy 1 B") is None  # an older report
    assert note_version("chose native (float32 prefill, cols 16384: cols < 21753)") is None


# ------------------------------------------------------------------ a staged folder as the kit loads it

_LIBRARY = '''
import torch

_lib = torch.library.Library("lr_staged_probe", "DEF")
_lib.define("probe(Tensor x) -> Tensor")
'''


@pytest.fixture
def namespace_release(tmp_path: Path) -> Iterator[tuple[loading.Source, Path]]:
    """A staged release laid out as the staging scripts lay vLLM's out: the package folder without an
    `__init__.py` (a namespace package), its library module, and the release's `*.dist-info`."""
    folder = tmp_path / "lrstaged-1.2.0"
    (folder / "lrstaged").mkdir(parents=True)
    (folder / "lrstaged" / "_lib.py").write_text(_LIBRARY)
    (folder / "lrstaged-1.2.0.dist-info").mkdir()
    source = loading.Source(("lrstaged._lib",), "lrstaged", "lrstaged", "lrstaged._lib", "lr_staged_probe", "probe")
    loading.forget()
    try:
        yield source, folder
    finally:
        sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp_path))]
        for name in [n for n in sys.modules if n.split(".")[0] == "lrstaged"]:
            del sys.modules[name]
        loading.forget()


def test_a_staged_release_folder_loads_with_its_version_and_a_second_is_refused(
        namespace_release: tuple[loading.Source, Path], tmp_path: Path) -> None:
    source, folder = namespace_release
    got = loading.find(source, str(folder))
    assert isinstance(got, loading.Loaded) and got.version == "1.2.0" and got.source == str(folder)
    other = tmp_path / "lrstaged-1.3.0"
    (other / "lrstaged").mkdir(parents=True)
    refused = loading.find(source, str(other))
    assert refused == (f"this process already imported lrstaged from {folder / 'lrstaged'}; another copy cannot be "
                       "loaded beside it (run it in a process of its own: --isolate)")


def test_an_installed_release_beside_a_staged_one_keeps_its_column(peers: ModuleType, staged: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.rmtree(staged / "flashinfer-0.7.2.post1")
    installed = {"flashinfer-python": "0.7.2.post1", "vllm": "0.34.0"}
    monkeypatch.setattr(catalog, "installed_version", lambda source: installed.get(source.dist))
    cols = peers.columns(staged)
    assert [c for c in cols if c.split("@")[0] == "flashinfer-ragged"] == [
        "flashinfer-ragged", _on("flashinfer-ragged", "flashinfer-0.7.4", staged)]
    assert "flashinfer-ragged-det" not in cols  # it takes 0.7.4 only: the staged one
    assert "vllm-native" not in cols  # the installed 0.34.0 is staged already


def test_a_staged_release_built_for_another_torch_says_so_in_one_line(tmp_path: Path) -> None:
    from logitreplay.selectors.upstream.sglang import SGL_KERNEL

    folder = tmp_path / "sglang-kernel-0.4.10"
    (folder / "sgl_kernel").mkdir(parents=True)
    (folder / "sgl_kernel" / "__init__.py").write_text(
        'raise OSError("common_ops.abi3.so: undefined symbol: _ZN3c1019NotImplementedErrorC1E")\n')
    (folder / "sglang_kernel-0.4.10.dist-info").mkdir()
    (folder / "sglang_kernel-0.4.10.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: sglang-kernel\nVersion: 0.4.10\nRequires-Dist: torch==2.99.1\n")
    assert SGL_KERNEL.refuses("0.4.10") is None  # its ops are 0.4.6's: known, but built for another torch
    loading.forget()
    try:
        got = loading.find(SGL_KERNEL.source, str(folder))
    finally:
        sys.path[:] = [p for p in sys.path if not p.startswith(str(tmp_path))]
        loading.forget()
    running = __import__("torch").__version__.split("+")[0]
    assert got == (f"sgl_kernel does not import: sglang-kernel 0.4.10 is built for torch 2.99.1, this is torch "
                   f"{running} (OSError: common_ops.abi3.so: undefined symbol: _ZN3c1019NotImplementedErrorC1E)")


def test_a_report_records_the_release_each_staged_column_ran_from(staged: Path) -> None:
    from logitreplay.selectors.provenance import peer_versions

    got = peer_versions([f"vllm-native@{staged / 'vllm-0.34.0'}", f"flashinfer-ragged-det@{staged / 'flashinfer-0.7.4'}",
                         "vllm-native@/nowhere/lib.so"])
    assert got == {f"vllm-native@{staged / 'vllm-0.34.0'}": "vllm 0.34.0 from vllm-0.34.0",
                   f"flashinfer-ragged-det@{staged / 'flashinfer-0.7.4'}": "flashinfer-python 0.7.4 from flashinfer-0.7.4",
                   "vllm-native@/nowhere/lib.so": "from lib.so"}


def test_releases_side_by_side_share_processes_where_nothing_clashes(staged: Path) -> None:
    from logitreplay.selectors.registry import needs_own_process, process_groups

    v33, v34, fi074 = (staged / n for n in ("vllm-0.33.0", "vllm-0.34.0", "flashinfer-0.7.4"))
    specs = ["native", "flashinfer-ragged", f"vllm-native@{v33}", f"vllm-deepselect@{v34}",
             f"flashinfer-ragged@{fi074}", f"vllm-native@{v34}", f"vllm-deepselect@{v33}"]
    # a staged folder imports its package (`vllm`) once per process, whichever library of it is asked for
    assert process_groups(specs) == [[0, 1, 2, 6], [3, 4, 5]]
    assert needs_own_process([f"vllm-native@{v33}", f"vllm-deepselect@{v34}"])
    assert not needs_own_process(["vllm-native@/a/x.so", "vllm-deepselect@/b/y.so"])  # library files: no package
    assert process_groups(["native", "flashinfer-ragged", "sgl-fast-topk"]) == [[0, 1, 2]]


@pytest.mark.slow
def test_a_replay_runs_two_releases_in_two_processes_not_one_per_selector(tmp_path: Path) -> None:
    from logitreplay.replay import ReplayConfig, run_replay
    from logitreplay.replay.results import validate

    folders = [tmp_path / f"flashinfer-{v}" for v in ("0.7.2.post1", "0.7.4")]
    for folder in folders:
        folder.mkdir()
    specs = ("reference", *(f"{name}@{f}" for f in folders for name in ("flashinfer-ragged", "flashinfer-paged")))
    run = run_replay(ReplayConfig(suite="seed-controls", case_globs=("b-*",), selectors=specs, device="cpu", rounds=1))
    assert run.result.selectors == ["reference", "flashinfer-ragged@flashinfer-0.7.2.post1",
                                    "flashinfer-paged@flashinfer-0.7.2.post1", "flashinfer-ragged@flashinfer-0.7.4",
                                    "flashinfer-paged@flashinfer-0.7.4"]
    assert any("the selectors ran in 2 processes" in n for n in run.result.notes), run.result.notes
    assert not any("each selector ran in its own process" in n for n in run.result.notes)
    assert all(r.status in ("ok", "unsupported") for c in run.result.cases for r in c.results)
    validate(run.result.to_json())


# A stand-in for the replay CLI (peers.CLI), written for this test: a run writes its report only when
# SIGTERM stops it (marked partial), a `--resume` run completes the report it is given.
_STANDIN_CLI = """
import json, signal, sys, time
args = sys.argv[1:]
if "--resume" in args:
    path = args[args.index("--resume") + 1]
    json.dump({"partial": None, "argv": args}, open(path, "w"))
    sys.exit(0)
path = args[args.index("--json") + 1]
def stop(*_):
    json.dump({"partial": {"signal": "SIGTERM"}, "argv": args}, open(path, "w"))
    sys.exit(130)
signal.signal(signal.SIGTERM, stop)
time.sleep(60)
"""


def test_a_suite_stopped_at_the_deadline_is_kept_partial_and_the_next_run_resumes_it(
        peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite longer than one GPU run: at the deadline the replay gets SIGTERM (not a kill), so its report
    of the finished cases survives, and the next run with the same --out resumes it instead of starting
    over."""
    monkeypatch.setattr(peers, "CLI", _STANDIN_CLI)
    report = tmp_path / "peers-long-decode.json"
    peers.replay(tmp_path, "long-decode", ["--suite", "long-decode"], "native", [], timeout=2.0)
    assert peers.partial(report)
    assert json.loads(report.read_text())["argv"][:3] == ["replay", "--suite", "long-decode"]
    peers.replay(tmp_path, "long-decode", ["--suite", "long-decode"], "native", [], timeout=30.0)
    assert not peers.partial(report)
    assert json.loads(report.read_text())["argv"] == ["replay", "--resume", str(report)]


def test_the_gpu_test_skips_a_release_built_for_another_torch_and_fails_other_declines() -> None:
    """tests/gpu/test_gpu_peers.py's judgement of a column's answers: a staged release built against another
    torch's ABI declines every case in one line (its designed answer, as sglang-kernel 0.4.10's columns gave
    on torch 2.11), which skips its test; a column that declines every case for any other reason fails."""
    from tests.gpu.test_gpu_peers import _verified

    reason = ("sgl_kernel does not import: sglang-kernel 0.4.10 is built for torch 2.14.1, this is torch 2.11.0 "
              "(OSError: Could not load this library: sgl_kernel/common_ops.abi3.so)")
    with pytest.raises(pytest.skip.Exception, match="built for another torch"):
        _verified([("decode", "unsupported", reason), ("prefill", "unsupported", reason)])
    with pytest.raises(AssertionError):
        _verified([("decode", "unsupported", "selects exactly top_k = 2048, not 512")])


def test_skip_leaves_out_the_matching_columns_but_never_the_reference(peers: ModuleType, staged: Path) -> None:
    names = (*peers.BUNDLED, *peers.columns(staged))
    kept = peers.kept(names, "*-det*,*@*vllm-0.33.0,flashinfer")
    assert peers.REFERENCE in kept and "deepselect-det" not in kept and "flashinfer" not in kept
    assert not [n for n in kept if n.endswith("vllm-0.33.0")]
    assert _on("vllm-native", "vllm-0.34.0", staged) in kept
    assert _on("flashinfer-paged", "flashinfer-0.7.4", staged) in kept
    assert peers.kept(names, "") == list(names)
