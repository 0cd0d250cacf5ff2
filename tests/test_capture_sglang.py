"""The SGLang plugin inside the released SGLang 0.5.23 indexer (the pinned wheel's sources, run on CPU by
tests/engine_fakes/sglang: only the kernels, the platform probes and the model runner are fakes).

Decode and target verify through `Indexer._get_topk_paged`, multi-request and chunked prefill (RAGGED and
PAGED) through `_get_topk_ragged`, the K-only path that builds no logits, every top-k dispatch of
`DSATopKBackend.topk_transform`, CUDA-graph replayed steps, scheduler processes that exit or are killed,
TP 1 and TP 2 (gloo) ranks. Every captured case is checked against the tests' own recomputation of the
logits (from the keys and queries, per request rather than through the page table) and of the row bounds.
"""

from __future__ import annotations

import ast
import collections
import inspect
import json
import multiprocessing
import os
import re
import signal
import time
import tomllib
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.archive.calls import read_calls
from logitreplay.capture import serving, sglang_plugin, sglang_sites
from logitreplay.capture.policy import Policy
from logitreplay.capture.sglang_plugin import SglangCapture
from logitreplay.capture.sglang_versions import LATEST, release
from logitreplay.cli import main
from tests.engine_fakes.sglang import forward as fw
from tests.engine_fakes.sglang import loader
from tests.engine_fakes.sglang.forward import INDEXER, LAYERS, PAGE, TOP_K, Forward
from tests.test_capture_sync import HostReads, held

TWO = [(150, 10), (70, 70)]  # request A: 150 tokens, the last 10 new; B: 70, all new (a fresh prompt)
pytestmark = pytest.mark.usefixtures("sglang", "fresh", "one_thread")


@pytest.fixture(scope="module")
def sglang(sglang_0523_tree: Path) -> Iterator[Any]:
    with loader.loaded(sglang_0523_tree) as module:
        yield module


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one CPU thread here: an OpenMP team started in this process would hang the workers that
    later tests fork from it (libgomp does not survive a fork)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """TP rank 0 of 1 without DP attention, SGLang's default switches, no recorded model; the capture is
    removed after the test."""
    publish(0, 1)
    for name in ("SGLANG_DSA_FUSE_TOPK", "SGLANG_OPT_USE_TOPK_V2", "SGLANG_PLUGINS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(serving.ENV_MODEL, raising=False)
    sglang_plugin._model_facts.cache_clear()
    yield
    if serving._active is not None:
        serving._active.uninstall()


ParallelConfig = collections.namedtuple("ParallelConfig", "tp_size attn_dp_size attn_cp_size")


def publish(tp_rank: int, tp_size: int, dp_size: int = 1) -> None:
    """What a scheduler process publishes in SGLang's runtime context: the parallel config (the widths,
    which SGLang projects from its server args) and the process's ranks (attention TP within DP)."""
    from sglang.srt.runtime_context import get_parallel

    attn_tp = tp_size // dp_size
    parallel = get_parallel()
    parallel.clear_stamp()
    parallel._config = ParallelConfig(tp_size, dp_size, 1)
    parallel.override_permanently(tp_rank=tp_rank, attn_tp_rank=tp_rank % attn_tp, attn_tp_size=attn_tp,
                                  attn_dp_rank=tp_rank // attn_tp)


def _capture(tmp_path: Path, policy: str = "every", **kw: Any) -> SglangCapture:
    capture = SglangCapture(tmp_path / "cap.zarr", Policy.parse(policy),
                            provenance={"engine": "sglang", "engine_version": "0.5.23"}, **kw)
    capture.install()
    return capture


def _cases(path: Path) -> list[Case]:
    archive = Archive.open(path)
    return sorted((archive.read(c) for c in archive.case_ids()), key=lambda c: c.case_id)


def _summaries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted(path.glob("capture-summary-*.json"))]


def _replays(path: Path) -> None:
    result = CliRunner().invoke(main, ["replay", str(path), "--strict"])
    assert result.exit_code == 0, result.output


def _logits(f: Forward, layer: int, row: int) -> torch.Tensor:
    """Row `row`'s logits recomputed from its request's keys (dequantized, in request order: no page table)
    and the queries and head weights the indexer was given:
    sum over heads of weight * relu(q . k)."""
    q = f.batch.inputs["q_fp8"][layer][row].as_subclass(torch.Tensor).float()
    w = f.batch.inputs["weights"][layer][row, :, 0]
    keys = f.keys[layer][f.request_of_row[row]][: f.row_lengths[row]]
    return (torch.relu(q @ keys.T) * w[:, None]).sum(0)


def _assert_case(case: Case, f: Forward, layer: int, rows: range | None = None) -> None:
    """The case's rows are the recomputed logits over the recomputed bounds; its reference selects each
    row's top-k values."""
    rows = range(len(f.request_of_row)) if rows is None else rows
    starts = [f.key_offsets[r] for r in rows]
    assert case.row_starts.tolist() == starts
    assert case.row_ends.tolist() == [s + f.row_lengths[r] for s, r in zip(starts, rows, strict=True)]
    assert case.dtype == "float32" and np.isfinite(case.values).all()  # nothing from outside a window
    ref = case.reference_indices
    assert ref is not None
    for i, r in enumerate(rows):
        row = case.row(i)
        torch.testing.assert_close(row, _logits(f, layer, r), rtol=1e-5, atol=1e-5)
        k = min(TOP_K, row.shape[0])
        chosen = ref[i][ref[i] >= 0]  # an unsorted top-k (FlashInfer's) may interleave its -1 padding
        assert chosen.shape[0] == k and (ref[i][ref[i] < 0] == -1).all()
        picked = row[torch.from_numpy(chosen).long()]
        assert torch.equal(picked.sort().values, row.topk(k).values.sort().values)


def _by_layer(path: Path) -> list[Case]:
    return sorted(_cases(path), key=lambda c: (c.attrs["layer_index"], c.attrs.get("row_window", {}).get("start", 0)))


def _pages(case: Case) -> list[list[int]]:
    return [[p for first, end, page in runs for p in range(page, page + end - first)]
            for runs in case.attrs["transform"]["page_table"]]


def test_decode_cases_are_the_logits_the_real_indexer_built(tmp_path: Path) -> None:
    runner = fw.build()
    f = fw.decode(runner, [130, 70, 200])
    capture = _capture(tmp_path)
    runner.forward(f.batch)
    summary = capture.close()
    assert summary is not None and summary["captured"] == LAYERS and summary["error"] is None, summary
    for layer, case in enumerate(_by_layer(tmp_path / "cap.zarr")):
        _assert_case(case, f, layer)
        a = case.attrs
        assert a["layer_name"] == INDEXER.format(layer) and a["layer_index"] == layer
        assert a["kind"] == "decode" and a["chunk"]["requests"] == 3
        assert a["decode"]["next_n"] == 1 and a["decode"]["seq_lens"] == [[130], [70], [200]]
        assert a["topk_transform"] == "topk_transform_paged_v2" and a["sglang"]["caller"] == "Indexer._get_topk_paged"
        assert case.cols == 4 * PAGE and case.row_stride == 256  # max_seq_len wide, DeepGEMM's padded rows
        table = f.batch.inputs["dsa"][0].real_page_table
        assert _pages(case) == [table[b, :n].tolist() for b, n in enumerate((3, 2, 4))]
        assert a["engine"] == "sglang" and a["engine_version"] == "0.5.23"
        assert a["tensor_parallel"]["tp_rank"] == 0 and a["tensor_parallel"]["attn_dp_size"] == 1
    _replays(tmp_path / "cap.zarr")


def test_target_verify_is_a_speculative_decode_case(tmp_path: Path) -> None:
    runner = fw.build()
    f = fw.decode(runner, [100, 300], next_n=3)
    capture = _capture(tmp_path, "layers=1")
    runner.forward(f.batch)
    capture.close()
    [case] = _cases(tmp_path / "cap.zarr")
    _assert_case(case, f, 1)
    assert case.row_ends.tolist() == [98, 99, 100, 298, 299, 300]
    d = case.attrs["decode"]
    assert (d["next_n"], d["speculative"], d["seq_lens"]) == (3, True, [[98, 99, 100], [298, 299, 300]])
    assert case.attrs["sglang"]["forward_mode"] == "TARGET_VERIFY" and case.attrs["chunk"]["requests"] == 2


def test_draft_extend_is_captured_as_a_paged_call_of_its_own_path(tmp_path: Path) -> None:
    """EAGLE v2's draft extend scores next_n rows a request through `_get_topk_paged`, as target verify
    does; it is no decode step of the served model, so its case is a paged call, not a decode case."""
    runner = fw.build()
    f = fw.decode(runner, [100, 300], next_n=2, draft=True)
    capture = _capture(tmp_path, "layers=0")
    runner.forward(f.batch)
    summary = capture.close()
    assert summary is not None and summary["calls_by_path"]["draft_extend"]["captured"] == 1, summary
    [case] = _cases(tmp_path / "cap.zarr")
    _assert_case(case, f, 0)
    a = case.attrs
    assert a["sglang"]["forward_mode"] == "DRAFT_EXTEND_V2" and "kind" not in a and a["chunk"]["layout"] == "paged"


def test_ragged_prefill_of_two_requests_keeps_their_windows_and_offsets(tmp_path: Path) -> None:
    runner = fw.build()
    f = fw.extend(runner, TWO)
    capture = _capture(tmp_path)
    runner.forward(f.batch)
    capture.close()
    cases = _by_layer(tmp_path / "cap.zarr")
    assert len(cases) == LAYERS
    for layer, case in enumerate(cases):
        _assert_case(case, f, layer)  # v2 overwrote the columns just before each window: not in the case
        a = case.attrs
        assert a["chunk"]["requests"] == 2 and a["chunk"]["layout"] == "absolute" and "row_window" not in a
        assert a["chunk"]["row_key_offsets"] == [[0, 10, 0], [10, 80, 150]]
        assert a["topk_transform"] == "topk_transform_ragged_v2" and a["sglang"]["method"] == "RAGGED"
        assert a["transform"]["row_offsets"] == [[0, 10, 0], [10, 80, 150]] and "kind" not in a
    _replays(tmp_path / "cap.zarr")


@pytest.mark.parametrize(("ragged", "call"), [(True, "topk_transform_ragged_v2"),
                                              (False, "fast_topk_transform_fused")])
def test_chunked_prefill_records_each_chunks_row_window(ragged: bool, call: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang splits the rows when the logits exceed its budget (here any size is checked, and 30 rows of
    the batch's 220 keys fit): RAGGED chunks pass their offsets, PAGED ones their rows' requests."""
    from sglang.srt.layers.attention import mqa_logits_utils

    monkeypatch.setattr(mqa_logits_utils, "MQA_LOGITS_STATIC_SKIP_ELEMS", 0)
    runner = fw.build(budget_bytes=30 * 220 * 4)
    f = fw.extend(runner, TWO, ragged=ragged)
    capture = _capture(tmp_path, "every,layers=0")
    runner.forward(f.batch)
    capture.close()
    cases = _by_layer(tmp_path / "cap.zarr")
    windows = [(c.attrs["row_window"]["start"], c.attrs["row_window"]["end"]) for c in cases]
    assert windows == [(0, 30), (30, 60), (60, 80)]
    for case, (start, end) in zip(cases, windows, strict=True):
        _assert_case(case, f, 0, range(start, end))
        assert case.attrs["topk_transform"] == call and case.attrs["chunk"]["forward_rows"] == 80
    assert [c.attrs["chunk"]["requests"] for c in cases] == [2, 1, 1]
    _replays(tmp_path / "cap.zarr")


@pytest.mark.parametrize(("backend", "switches", "calls"), [
    ("sgl-kernel", {"SGLANG_OPT_USE_TOPK_V2": "0"}, ("fast_topk_transform_fused", "fast_topk_transform_ragged_fused")),
    ("sgl-kernel", {"SGLANG_DSA_FUSE_TOPK": "0"}, ("sgl_kernel.fast_topk_v2",) * 2),
    ("torch", {"SGLANG_DSA_FUSE_TOPK": "0"}, ("torch.topk",) * 2),
    ("flashinfer", {}, ("flashinfer.top_k_page_table_transform", "flashinfer.top_k_ragged_transform")),
    ("flashinfer", {"SGLANG_DSA_FUSE_TOPK": "0"}, ("flashinfer.top_k",) * 2),
])
def test_every_top_k_path_is_named_and_mapped_back(backend: str, switches: dict[str, str], calls: tuple[str, str],
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in switches.items():
        monkeypatch.setenv(name, value)
    runner = fw.build()
    capture = _capture(tmp_path, "layers=0")
    decode = fw.decode(runner, [130, 70], topk_backend=backend)
    runner.forward(decode.batch)
    prefill = fw.extend(runner, TWO, topk_backend=backend)
    runner.forward(prefill.batch)
    capture.close()
    cases = sorted(_cases(tmp_path / "cap.zarr"), key=lambda c: c.attrs.get("kind", "z"))
    assert tuple(c.attrs["topk_transform"] for c in cases) == calls
    _assert_case(cases[0], decode, 0)
    _assert_case(cases[1], prefill, 0)


def test_default_policy_keeps_one_case_per_layer_and_batch_bucket(tmp_path: Path) -> None:
    runner = fw.build(pages=64)
    capture = _capture(tmp_path, "")
    for seq_lens in ([130, 70], [150, 80], [140, 60, 50]):  # 2, 2, then 3 rows (bucket 4); 192 wide
        runner.forward(fw.decode(runner, seq_lens).batch)
    summary = capture.close()
    assert summary is not None and summary["captured"] == 2 * LAYERS and summary["forwards"] == 3
    assert sorted((c.attrs["layer_index"], c.rows) for c in _cases(tmp_path / "cap.zarr")) == [
        (0, 2), (0, 3), (1, 2), (1, 3)]


def test_cuda_graph_replays_are_counted_and_capture_runs_stage_nothing(tmp_path: Path) -> None:
    from tests.engine_fakes.sglang.runner import DecodeCudaGraphRunner

    runner = fw.build(pages=64)
    capture = _capture(tmp_path)
    graphs = DecodeCudaGraphRunner(runner, {2: fw.decode(runner, [130, 70]).batch})
    graphs.capture()  # warm-up and capture runs in SGLang's capture mode: nothing staged, nothing counted
    runner.decode_cuda_graph_runner = graphs
    assert capture.writer is None
    runner.forward(fw.decode(runner, [131, 71]).batch)  # replayed: no Python in the layers
    eager = fw.decode(runner, [131, 71, 20])  # 3 rows: no graph, eager
    runner.forward(eager.batch)
    summary = capture.close()
    assert summary is not None and capture.error is None and summary["error"] is None, summary
    assert summary["captured"] == LAYERS and summary["forwards"] == 1 and summary["cuda_graph"]["replayed_steps"] == 1
    for layer, case in enumerate(_by_layer(tmp_path / "cap.zarr")):
        _assert_case(case, eager, layer)


def test_every_top_k_call_is_counted_by_path_and_outcome(tmp_path: Path) -> None:
    """Decode, target verify and extend calls captured or skipped by the policy; the K-only path (no
    sequence longer than index_topk: SGLang runs the top-k on dummy zeros) counted as not capturable, with
    why; the graph runner's capture runs counted as warm-up."""
    from tests.engine_fakes.sglang.runner import DecodeCudaGraphRunner

    runner = fw.build(pages=64)
    capture = _capture(tmp_path, "every,layers=0")
    graphs = DecodeCudaGraphRunner(runner, {1: fw.decode(runner, [90]).batch})
    graphs.capture()
    for f in (fw.decode(runner, [130, 70]), fw.decode(runner, [100, 300], next_n=3), fw.extend(runner, TWO),
              fw.extend(runner, [(12, 12), (5, 5)])):
        runner.forward(f.batch)
    summary = capture.close()
    assert summary is not None and summary["captured"] == 3, summary
    paths = summary["calls_by_path"]
    zero = {"captured": 0, "skipped": 0, "warmup": 0, "not_capturable": 0}
    assert paths["decode"] == {**zero, "captured": 1, "skipped": 1, "warmup": 2 * LAYERS}
    assert paths["target_verify"] == paths["extend"] == {**zero, "captured": 1, "skipped": 1}
    assert paths["k_only"] == {**zero, "not_capturable": LAYERS, "why_not_capturable": sglang_sites.K_ONLY}
    assert len(_cases(tmp_path / "cap.zarr")) == 3


def test_an_sglang_release_the_plugin_does_not_know_is_refused_in_one_line(
        sglang: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Nothing is wrapped (nothing half-right is stored); the server log and the run summary say why."""
    from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import DSAIndexerMetadata

    original = DSAIndexerMetadata.topk_transform
    monkeypatch.setattr(sglang, "__version__", "0.5.24")
    monkeypatch.setenv(serving.ENV_DIR, str(tmp_path / "cap.zarr"))
    with caplog.at_level("ERROR", logger="logitreplay.capture"):
        sglang_plugin.register()
    capture = serving._active
    assert isinstance(capture, SglangCapture) and DSAIndexerMetadata.topk_transform is original
    [line] = [r.getMessage() for r in caplog.records]
    assert "SGLang 0.5.24 is not a release the logitreplay capture plugin knows (0.5.23)" in line
    runner = fw.build()
    runner.forward(fw.decode(runner, [130, 70]).batch)
    summary = capture.close()
    assert summary is not None and summary["captured"] == 0 and "0.5.24" in summary["engine_unsupported"]
    assert _cases(tmp_path / "cap.zarr") == []


def test_release_versions() -> None:
    assert release("0.5.23") is LATEST and release("0.5.23.post1") is LATEST
    assert release("0.5.22") is None and release(None) is None and release("0.5.230") is None


def test_the_plugin_never_reads_the_device_on_the_model_thread(tmp_path: Path) -> None:
    """Every host read the plugin's part of a call makes is watched (the writer is held: nothing of the
    case is copied to the host while the model runs)."""
    runner = fw.build()
    capture = _capture(tmp_path)
    capture._writer()
    offer = capture.offer

    def watched_offer(*args: Any) -> None:
        with HostReads() as reads:
            offer(*args)
        assert not reads.calls, reads.calls

    capture.offer = watched_offer  # type: ignore[method-assign]
    batches = [fw.decode(runner, [130, 70, 20]).batch, fw.extend(runner, TWO).batch]
    assert capture.writer is not None
    with held(capture.writer):
        for batch in batches:
            runner.forward(batch)
    summary = capture.close()
    assert capture.error is None and summary is not None and summary["captured"] == 2 * LAYERS
    _replays(tmp_path / "cap.zarr")


def test_the_site_reads_the_released_signature_and_uninstalls() -> None:
    from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import DSAIndexerMetadata

    original = DSAIndexerMetadata.topk_transform
    assert list(inspect.signature(original).parameters)[1:] == list(LATEST.params)
    capture = SglangCapture("unused", Policy())
    capture.install()
    assert DSAIndexerMetadata.topk_transform is not original
    capture.uninstall()
    assert DSAIndexerMetadata.topk_transform is original


def test_the_fake_runner_keeps_the_released_runners_facts(sglang_0523_tree: Path) -> None:
    """What the plugin relies on in the model runner the tests fake (its module imports the whole server):
    `ModelRunner.forward(forward_batch, ...)` in `model_runner.py`, returning a `ModelRunnerOutput` with
    `can_run_graph`; SGLang's capture mode is `runner_utils.capture_mode.get_is_capture_mode`."""
    source = (sglang_0523_tree / LATEST.runner_module.replace(".", "/")).with_suffix(".py").read_text()
    classes = {n.name: n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}
    forward = next(n for n in classes["ModelRunner"].body if isinstance(n, ast.FunctionDef) and n.name == "forward")
    assert [a.arg for a in forward.args.args[:2]] == ["self", "forward_batch"]
    fields = {n.target.id for n in classes["ModelRunnerOutput"].body if isinstance(n, ast.AnnAssign)
              and isinstance(n.target, ast.Name)}
    assert "can_run_graph" in fields
    from sglang.srt.model_executor.runner_utils import capture_mode

    assert capture_mode.__file__ is not None and str(sglang_0523_tree) in capture_mode.__file__
    assert capture_mode.__name__ == LATEST.capture_mode_module and not capture_mode.get_is_capture_mode()


def test_plugin_is_registered_and_off_without_its_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["sglang.srt.plugins"]["logitreplay_capture"]
    assert target == "logitreplay.capture.sglang_plugin:register"
    monkeypatch.delenv(serving.ENV_DIR, raising=False)
    sglang_plugin.register()
    assert serving._active is None
    monkeypatch.setenv(serving.ENV_DIR, str(tmp_path / "cap.zarr"))
    sglang_plugin.register()
    assert isinstance(serving._active, SglangCapture)


# -- scheduler processes: SGLang spawns one per TP rank and loads the plugins in each


def _worker(tree: str, out: str, policy: str, kill: bool, tp: tuple[int, int, int], ranks: str,
            gloo: str | None) -> None:
    """A scheduler process: the released SGLang loaded, the plugins loaded as `run_scheduler_process`
    does (the released `sglang.srt.plugins.load_plugins`), ranks published (and a gloo group joined for
    TP 2), a decode and a prefill forward, then the end of a multiprocessing child or a SIGKILL."""
    torch.set_num_threads(1)
    loader.load(Path(tree))
    os.environ[serving.ENV_DIR] = out
    os.environ[serving.ENV_POLICY] = policy
    os.environ[serving.ENV_RANKS] = ranks
    if gloo is not None:
        torch.distributed.init_process_group("gloo", init_method=gloo, rank=tp[0], world_size=tp[1])
    from sglang.srt import plugins

    value = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())[
        "project"]["entry-points"][plugins.GENERAL_PLUGINS_GROUP]["logitreplay_capture"]
    plugins.entry_points = lambda group: [EntryPoint("logitreplay_capture", value, group)]  # type: ignore[attr-defined]
    plugins.load_plugins()
    publish(*tp)
    runner = fw.build(seed=0)
    runner.forward(fw.decode(runner, [130, 70, 20]).batch)
    runner.forward(fw.extend(runner, TWO).batch)
    if kill:
        assert serving._active is not None and serving._active.writer is not None
        deadline = time.monotonic() + 30
        while [s["captured"] for s in _summaries(Path(out))] != [2 * LAYERS] and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGKILL)
    if gloo is not None:
        torch.distributed.barrier()


def _spawn(*args: Any) -> multiprocessing.process.BaseProcess:
    """A scheduler process as SGLang starts one: multiprocessing's spawn."""
    process = multiprocessing.get_context("spawn").Process(target=_worker, args=args, daemon=True)
    process.start()
    return process


def _exitcode(process: multiprocessing.process.BaseProcess) -> int | None:
    process.join(120)
    return process.exitcode


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True])
def test_a_scheduler_process_that_ends_keeps_every_case(kill: bool, tmp_path: Path, sglang_0523_tree: Path) -> None:
    out = tmp_path / "cap.zarr"
    process = _spawn(str(sglang_0523_tree), str(out), "every", kill, (0, 1, 1), "auto", None)
    assert _exitcode(process) == (-signal.SIGKILL if kill else 0)
    cases = _cases(out)
    assert sorted((c.attrs.get("kind", "prefill"), c.attrs["chunk"]["requests"]) for c in cases) == [
        ("decode", 3), ("decode", 3), ("prefill", 2), ("prefill", 2)]
    [summary] = _summaries(out)
    assert summary["captured"] == 2 * LAYERS and summary["final"] is not kill and summary["error"] is None
    if not kill:  # the per-forward call record, written at the exit: two forwards of one call per layer
        [record] = read_calls(Archive.open(out))
        assert record.engine == "sglang" and [f.n_calls for f in record.forwards] == [LAYERS, LAYERS]
    _replays(out)


@pytest.mark.slow
def test_tp2_scheduler_processes_in_one_gloo_group(tmp_path: Path, sglang_0523_tree: Path) -> None:
    """Two scheduler processes in one gloo group, with DP attention (each rank its own attention group, so
    `auto` stores on both). Each rank's cases match the recomputation (the same seeds on each rank)."""
    out = tmp_path / "cap.zarr"
    gloo = f"file://{tmp_path / 'gloo'}"
    procs = [_spawn(str(sglang_0523_tree), str(out), "layers=0", False, (r, 2, 2), "auto", gloo) for r in range(2)]
    assert [_exitcode(p) for p in procs] == [0, 0]
    cases = _cases(out)
    assert sorted(c.attrs["tensor_parallel"]["tp_rank"] for c in cases) == [0, 0, 1, 1]
    runner = fw.build(seed=0)
    expected = {"decode": fw.decode(runner, [130, 70, 20]), "prefill": fw.extend(runner, TWO)}
    for c in cases:
        tp = c.attrs["tensor_parallel"]
        assert (tp["tp_size"], tp["attn_dp_size"], tp["attn_dp_rank"]) == (2, 2, tp["tp_rank"])
        _assert_case(c, expected[c.attrs.get("kind", "prefill")], 0)
    assert sorted(s["captured"] for s in _summaries(out)) == [2, 2]


@pytest.mark.parametrize(("dp", "ranks", "stores"), [(1, "auto", [True, False]), (2, "auto", [True, True]),
                                                     (1, "all", [True, True]), (1, "1", [False, True])])
def test_tp2_ranks_that_store(dp: int, ranks: str, stores: list[bool], tmp_path: Path) -> None:
    """Attention-TP ranks of one group score the same rows: `auto` stores on each group's attention-TP rank
    0; `all` and a rank list name TP ranks; a rank that stores nothing writes nothing."""
    for rank, expect in enumerate(stores):
        publish(rank, 2, dp)
        out = tmp_path / f"rank{rank}.zarr"
        chosen = serving.AUTO if ranks == "auto" else None if ranks == "all" else {int(ranks)}
        capture = SglangCapture(out, Policy.parse("layers=0"), ranks=chosen)
        capture.install()
        runner = fw.build(seed=0)
        f = fw.decode(runner, [130, 70, 20])
        runner.forward(f.batch)
        summary = capture.close()
        capture.uninstall()
        if not expect:
            assert summary is None and not out.exists(), (rank, summary)
            continue
        assert summary is not None and summary["captured"] == 1 and summary["calls"] == LAYERS, (rank, summary)
        [case] = _cases(out)
        _assert_case(case, f, 0)
        assert case.attrs["tensor_parallel"]["tp_rank"] == rank


def test_every_test_the_supported_versions_table_names_exists() -> None:
    """docs/capture.md's SGLang rows name the tests that prove them: each is one of this module's."""
    doc = (Path(__file__).parents[1] / "docs" / "capture.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| SGLang")]
    named = re.findall(r"tests/test_capture_sglang\.py::(\w+)", "\n".join(rows))
    assert len(rows) >= 10 and named
    assert [n for n in named if not callable(globals().get(n))] == []
