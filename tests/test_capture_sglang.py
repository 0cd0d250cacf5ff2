"""The SGLang plugin against call sites that reproduce SGLang 0.5.23's (tests/sglang0523: module paths,
class, function and local names, the top-k backend's dispatch and output contracts, uncleaned logits with
a padded stride, shuffled pages): decode and target verify through `_get_topk_paged`, multi-request and
chunked prefill through `_get_topk_ragged`, every top-k path mapped back to row-local indices, scheduler
processes that exit or are SIGKILLed, TP and DP-attention ranks, CUDA-graph decode, and no host sync."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import tomllib
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
from logitreplay.cli import main
from tests.sglang0523.steps import (  # noqa: F401  (fixtures)
    INDEXER,
    LAYERS,
    PAGE,
    TOP_K,
    build,
    decode_batch,
    extend_batch,
    fresh_sglang,
    publish,
    sglang0523,
    watched,
)
from tests.test_capture_sync import DEVICES, HostReads, held, no_host_sync
from tests.test_capture_vllm import _await_summary, _cases, _summaries

pytestmark = pytest.mark.usefixtures("sglang0523", "fresh_sglang", "one_thread")
TWO = [(150, 10), (70, 70)]  # request A: 150 tokens, the last 10 new; B: 70, all new (a fresh prompt)


@pytest.fixture(scope="module")
def one_thread() -> Any:
    """Torch on one CPU thread here: an OpenMP team started in this process would hang the workers that
    later tests fork from it (libgomp does not survive a fork)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _capture(tmp_path: Path, policy: str = "every", **kw: Any) -> SglangCapture:
    capture = SglangCapture(tmp_path / "cap.zarr", Policy.parse(policy),
                            provenance={"engine": "sglang", "engine_version": "0.5.23"}, **kw)
    capture.install()
    return capture


def _replays(path: Path) -> None:
    result = CliRunner().invoke(main, ["replay", str(path), "--strict"])
    assert result.exit_code == 0, result.output


def _assert_exact(case: Case, logits: torch.Tensor, starts: list[int], ends: list[int]) -> None:
    """Each row is the in-window part of what the top-k read, bit for bit; the reference holds the row's
    top-k values (mapped back from SGLang's page slots or offsets)."""
    seen = logits.cpu()
    assert case.row_starts.tolist() == starts and case.row_ends.tolist() == ends
    assert case.cols == seen.shape[1] and case.dtype == "float32"
    assert np.isfinite(case.values).all()  # none of the NaN / inf / 3e38 garbage outside the windows
    ref = case.reference_indices
    assert ref is not None
    for r, (s, e) in enumerate(zip(starts, ends, strict=True)):
        row = case.row(r)
        assert torch.equal(row.view(torch.int32), seen[r, s:e].contiguous().view(torch.int32))
        k = min(TOP_K, e - s)
        assert (ref[r, k:] == -1).all()
        picked = row[torch.from_numpy(ref[r, :k]).long()]
        assert torch.equal(picked.sort().values, row.topk(k).values.sort().values)


def _pages(case: Case, batch: Any) -> list[list[int]]:
    """The recorded page table rows expanded back to pages."""
    return [[p for first, end, page in runs for p in range(page, page + end - first)]
            for runs in case.attrs["transform"]["page_table"]]


def test_decode_cases_are_the_calls_bit_for_bit_with_the_page_table(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    runner = build()
    batch = decode_batch(runner, [130, 70, 200])
    capture = _capture(tmp_path)
    with watched(monkeypatch) as seen:
        runner.forward(batch)
    summary = capture.close()
    assert summary is not None and summary["captured"] == LAYERS and summary["error"] is None
    cases = sorted(_cases(tmp_path / "cap.zarr"), key=lambda c: c.attrs["layer_index"])
    for layer, case in enumerate(cases):
        _assert_exact(case, seen.logits[layer], [0, 0, 0], [130, 70, 200])
        a = case.attrs
        assert a["layer_name"] == INDEXER.format(layer) and a["layer_index"] == layer
        assert a["kind"] == "decode" and a["chunk"]["requests"] == 3
        assert a["decode"]["next_n"] == 1 and a["decode"]["seq_lens"] == [[130], [70], [200]]
        assert a["decode"]["backend"] == "sgl-kernel" and a["topk_transform"] == "topk_transform_paged_v2"
        assert case.cols == 4 * PAGE and case.row_stride > case.cols  # max_seq_len, the padded stride
        real = batch.attn_backend.forward_metadata.real_page_table
        assert _pages(case, batch) == [real[b, :n].tolist() for b, n in enumerate((3, 2, 4))]
        assert a["transform"]["output"] == "paged" and a["transform"]["page_size"] == PAGE
        assert a["engine"] == "sglang" and a["engine_version"] == "0.5.23"
        assert a["tensor_parallel"]["tp_rank"] == 0 and a["tensor_parallel"]["attn_dp_size"] == 1
    _replays(tmp_path / "cap.zarr")


def test_target_verify_is_a_speculative_decode_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = build()
    capture = _capture(tmp_path, "layers=1")
    with watched(monkeypatch) as seen:
        runner.forward(decode_batch(runner, [100, 300], next_n=3))
    capture.close()
    [case] = _cases(tmp_path / "cap.zarr")
    ends = [98, 99, 100, 298, 299, 300]
    _assert_exact(case, seen.logits[1], [0] * 6, ends)
    d = case.attrs["decode"]
    assert (d["next_n"], d["speculative"], d["seq_lens"]) == (3, True, [[98, 99, 100], [298, 299, 300]])
    assert case.attrs["sglang"]["forward_mode"] == "TARGET_VERIFY" and case.attrs["chunk"]["requests"] == 2


def test_ragged_prefill_of_two_requests_keeps_their_windows_and_offsets(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    runner = build()
    capture = _capture(tmp_path)
    with watched(monkeypatch) as seen:
        runner.forward(extend_batch(runner, TWO))
    capture.close()
    cases = sorted(_cases(tmp_path / "cap.zarr"), key=lambda c: c.attrs["layer_index"])
    assert len(cases) == LAYERS
    starts = [0] * 10 + [150] * 70  # each request's offset in the batch's flattened keys
    ends = [141 + i for i in range(10)] + [151 + i for i in range(70)]
    for layer, case in enumerate(cases):
        _assert_exact(case, seen.logits[layer], starts, ends)  # v2 masks columns before each window in place
        a = case.attrs
        assert a["chunk"]["requests"] == 2 and a["chunk"]["layout"] == "absolute"
        assert a["chunk"]["row_key_offsets"] == [[0, 10, 0], [10, 80, 150]] and "row_window" not in a
        assert a["topk_transform"] == "topk_transform_ragged_v2" and a["sglang"]["method"] == "RAGGED"
        assert a["transform"]["row_offsets"] == [[0, 10, 0], [10, 80, 150]]
        assert a["layer_name"] == INDEXER.format(layer) and "kind" not in a
    _replays(tmp_path / "cap.zarr")


def test_chunked_prefill_records_each_chunks_row_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = build()
    for layer in runner.model.model.layers:
        layer.self_attn.indexer.mqa_logits_budget_bytes = 30 * 220 * 4  # 30 rows of the 220 keys a chunk
    capture = _capture(tmp_path, "every,layers=0")
    with watched(monkeypatch) as seen:
        runner.forward(extend_batch(runner, TWO, ragged=False))  # PAGED: legacy fused, per-chunk batch_idx
    capture.close()
    cases = sorted(_cases(tmp_path / "cap.zarr"), key=lambda c: c.attrs["row_window"]["start"])
    windows = [(c.attrs["row_window"]["start"], c.attrs["row_window"]["end"]) for c in cases]
    assert windows == [(0, 30), (30, 60), (60, 80)]
    starts = [0] * 10 + [150] * 70
    ends = [141 + i for i in range(10)] + [151 + i for i in range(70)]
    for case, (s, e), logits in zip(cases, windows, seen.logits[:3], strict=True):
        _assert_exact(case, logits, starts[s:e], ends[s:e])
        assert case.attrs["topk_transform"] == "fast_topk_transform_fused"
        assert case.attrs["chunk"]["forward_rows"] == 80
    assert [c.attrs["chunk"]["requests"] for c in cases] == [2, 1, 1]
    _replays(tmp_path / "cap.zarr")


@pytest.mark.parametrize(("backend", "switches", "call"), [
    ("sgl-kernel", {"SGLANG_OPT_USE_TOPK_V2": "0"}, ("fast_topk_transform_fused", "fast_topk_transform_ragged_fused")),
    ("sgl-kernel", {"SGLANG_DSA_FUSE_TOPK": "0"}, ("sgl_kernel.fast_topk_v2",) * 2),
    ("torch", {"SGLANG_DSA_FUSE_TOPK": "0"}, ("torch.topk",) * 2),
])
def test_every_top_k_path_is_named_and_mapped_back(backend: str, switches: dict[str, str], call: tuple[str, str],
                                                   tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in switches.items():
        monkeypatch.setenv(name, value)
    runner = build()
    capture = _capture(tmp_path, "layers=0")
    with watched(monkeypatch) as seen:
        runner.forward(decode_batch(runner, [130, 70], backend=backend))
        runner.forward(extend_batch(runner, TWO, backend=backend))
    capture.close()
    decode, prefill = sorted(_cases(tmp_path / "cap.zarr"), key=lambda c: c.attrs.get("kind", "z"))
    assert (decode.attrs["topk_transform"], prefill.attrs["topk_transform"]) == call
    _assert_exact(decode, seen.logits[0], [0, 0], [130, 70])
    _assert_exact(prefill, seen.logits[2], [0] * 10 + [150] * 70,
                  [141 + i for i in range(10)] + [151 + i for i in range(70)])


def test_default_policy_keeps_one_case_per_layer_and_batch_bucket(tmp_path: Path) -> None:
    runner = build()
    capture = _capture(tmp_path, "")
    for seq_lens in ([130, 70], [150, 80], [140, 60, 50]):  # 2, 2, then 3 rows (bucket 4); 192 wide
        runner.forward(decode_batch(runner, seq_lens))
    summary = capture.close()
    assert summary is not None and summary["captured"] == 2 * LAYERS and summary["forwards"] == 3
    assert sorted((c.attrs["layer_index"], c.rows) for c in _cases(tmp_path / "cap.zarr")) == [
        (0, 2), (0, 3), (1, 2), (1, 3)]


@pytest.mark.parametrize("device", DEVICES)
def test_cuda_graph_decode_is_not_captured_and_is_counted(device: str, tmp_path: Path) -> None:
    """On CUDA the graph is real: its capture stages nothing (a copy would be baked into the graph)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    runner = build(device)
    capture = _capture(tmp_path)
    graphs = DecodeCudaGraphRunner(runner, {2: decode_batch(runner, [130, 70])})
    graphs.capture()  # warm-up and capture runs in capture mode: nothing staged, nothing counted
    runner.decode_cuda_graph_runner = graphs
    assert capture.writer is None
    runner.forward(decode_batch(runner, [131, 71]))  # replayed: no Python in the layers
    runner.forward(decode_batch(runner, [131, 71, 20]))  # 3 rows: no graph, eager
    summary = capture.close()
    assert summary is not None and capture.error is None, capture.error  # the plugin swallows its errors
    assert summary["error"] is None and summary["captured"] == LAYERS and summary["forwards"] == 1, summary
    assert summary["cuda_graph"]["replayed_steps"] == 1, summary
    assert {c.rows for c in _cases(tmp_path / "cap.zarr")} == {3}, summary


def _worker(out: str, policy: str, kill: bool, tp: tuple[int, int, int], ranks: str) -> None:
    """A scheduler process: plugins loaded as `run_scheduler_process` does, ranks published, two forwards,
    then the end of a multiprocessing child (its exit function, then the interpreter's) or a SIGKILL."""
    torch.set_num_threads(1)
    os.environ[serving.ENV_DIR] = out
    os.environ[serving.ENV_POLICY] = policy
    os.environ[serving.ENV_RANKS] = ranks
    from sglang.srt import plugins

    group = plugins.GENERAL_PLUGINS_GROUP  # the entry point as installed from pyproject.toml
    value = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())[
        "project"]["entry-points"][group]["logitreplay_capture"]
    plugins.entry_points = lambda group: [EntryPoint("logitreplay_capture", value, group)]  # type: ignore[attr-defined]
    plugins.load_plugins()
    publish(*tp)
    runner = build(seed=0)
    runner.forward(decode_batch(runner, [130, 70, 20]))
    runner.forward(extend_batch(runner, TWO))
    if kill:
        assert serving._active is not None and serving._active.writer is not None
        _await_summary(Path(out), 2 * LAYERS)
        os.kill(os.getpid(), signal.SIGKILL)


def _spawn(*args: Any) -> multiprocessing.process.BaseProcess:
    """A scheduler process as SGLang starts one: multiprocessing's spawn (`mp.set_start_method("spawn")`)."""
    process = multiprocessing.get_context("spawn").Process(target=_worker, args=args, daemon=True)
    process.start()
    return process


def _exitcode(process: multiprocessing.process.BaseProcess) -> int | None:
    process.join(120)
    return process.exitcode


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True])
def test_a_scheduler_process_that_ends_keeps_every_case(kill: bool, tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    assert _exitcode(_spawn(str(out), "every", kill, (0, 1, 1), "auto")) == (-signal.SIGKILL if kill else 0)
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
@pytest.mark.parametrize(("dp", "ranks", "writers"), [(1, "auto", [0]), (2, "auto", [0, 1]), (1, "all", [0, 1])])
def test_ranks_that_capture(dp: int, ranks: str, writers: list[int], tmp_path: Path) -> None:
    """Attention-TP ranks of one group score the same rows (auto: rank 0 of each group); with DP attention
    each group its own requests."""
    out = tmp_path / "cap.zarr"
    procs = [_spawn(str(out), "layers=0", False, (r, 2, dp), ranks) for r in range(2)]
    assert [_exitcode(p) for p in procs] == [0, 0]
    cases = _cases(out)
    assert sorted({c.attrs["tensor_parallel"]["tp_rank"] for c in cases}) == writers
    for c in cases:
        tp = c.attrs["tensor_parallel"]
        assert tp["tp_size"] == 2 and tp["attn_dp_size"] == dp and tp["attn_dp_rank"] == (tp["tp_rank"] if dp == 2 else 0)
    assert len(cases) == 2 * len(writers)


@pytest.mark.parametrize("device", DEVICES)
def test_the_plugin_never_syncs_the_model_thread(device: str, tmp_path: Path) -> None:
    """On CUDA the whole forward runs under torch's sync debug mode (error); on CPU, where the stand-in's
    own host reads of CPU tensors are SGLang's, the plugin's part of every call is watched."""
    runner = build(device)
    capture = _capture(tmp_path)
    capture._writer()
    if device == "cpu":
        offer = capture.offer

        def watched_offer(*args: Any) -> None:
            with HostReads() as reads:
                offer(*args)
            assert not reads.calls, reads.calls

        capture.offer = watched_offer  # type: ignore[method-assign]
    batches = [decode_batch(runner, [130, 70, 20]), extend_batch(runner, TWO)]
    assert capture.writer is not None
    with held(capture.writer), no_host_sync(device) if device == "cuda" else contextlib.nullcontext():
        for batch in batches:
            runner.forward(batch)
    summary = capture.close()
    assert capture.error is None and summary is not None and summary["error"] is None
    assert summary["captured"] == 2 * LAYERS
    for case in _cases(tmp_path / "cap.zarr"):
        assert case.attrs["device"] == (torch.cuda.get_device_name() if device == "cuda" else "cpu")
        assert case.reference_indices is not None
    _replays(tmp_path / "cap.zarr")


def test_the_site_reads_the_real_signature_and_uninstalls() -> None:
    import inspect

    from sglang.srt.layers.attention.dsa.dsa_indexer_metadata import DSAIndexerMetadata

    original = DSAIndexerMetadata.topk_transform
    assert list(inspect.signature(original).parameters)[1:] == list(sglang_sites._PARAMS)
    capture = SglangCapture("unused", Policy())
    capture.install()
    assert DSAIndexerMetadata.topk_transform is not original
    capture.uninstall()
    assert DSAIndexerMetadata.topk_transform is original


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
