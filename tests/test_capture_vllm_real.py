"""The vLLM plugin inside the released vLLM 0.33.0 and 0.34.0 indexer code (tests/upstream_wheels.py),
on CPU, with fakes only at the kernel boundary (tests/engine_fakes/vllm): every captured case is checked
against the logits and bounds recomputed from the step's inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive.store import Archive
from logitreplay.capture import serving
from logitreplay.capture.vllm_plugin import VllmCapture
from logitreplay.cli import main
from tests.engine_fakes.vllm import prefill
from tests.engine_fakes.vllm.checks import cases, check, plugin, summary
from tests.engine_fakes.vllm.edges import Edges
from tests.engine_fakes.vllm.prefill import Request

TWO = [Request(20, 12), Request(0, 9)]  # request A: 20 tokens cached, 12 new; B: 9 new


def test_prefill_chunks_are_captured_with_their_requests_and_bounds(tree: Path, tmp_path: Path) -> None:
    step = prefill.make_step(TWO)
    with plugin(tree, tmp_path, Edges()) as capture:
        first = prefill.chunk(step, list(range(12)), 0)
        second = prefill.chunk(step, list(range(12, 21)), 12)
        prefill.run(step, prefill.metadata(step, [first, second]))
        capture.close()
    a, b = cases(tmp_path / "cap.zarr")
    check(a, step, list(range(12)))
    check(b, step, list(range(12, 21)))
    assert (a.attrs["chunk"]["token_start"], a.attrs["chunk"]["token_end"]) == (0, 12)
    assert a.attrs["chunk"]["requests"] == 1 and "row_start" not in a.attrs["chunk"]
    assert a.attrs["layer_name"] == prefill.PREFIX.format(0) and a.attrs["logits_kind"] == "mqa_logits"
    assert a.attrs["chunk"]["layout"] == "compressed" and a.attrs["tensor_parallel"]["row_sharded"] is False
    assert summary(tmp_path / "cap.zarr")["calls_by_path"]["prefill"]["captured"] == 2


def test_two_requests_in_one_chunk_keep_their_key_offsets(tree: Path, tmp_path: Path) -> None:
    step = prefill.make_step(TWO, seed=1)
    with plugin(tree, tmp_path, Edges()) as capture:
        prefill.run(step, prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)]))
        capture.close()
    (case,) = cases(tmp_path / "cap.zarr")
    check(case, step, list(range(21)))
    assert case.attrs["chunk"]["requests"] == 2
    assert case.attrs["chunk"]["row_key_offsets"] == [[0, 12, 0], [12, 21, 32]]


def test_row_shard_windows_of_033_hold_each_ranks_rows(vllm_0330_tree: Path, tmp_path: Path) -> None:
    """vLLM 0.33: with `row_shard_sizes`, rank 1 of 2 scores rows [11, 21) of the step; with ranks=auto it
    captures them, as a window of the chunk."""
    step = prefill.make_step(TWO, seed=2)
    edges = Edges(tp_rank=1, tp_size=2)
    with plugin(vllm_0330_tree, tmp_path, edges) as capture:
        meta = prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)], row_shard_sizes=[11, 10])
        prefill.run(step, meta)
        capture.close()
    (case,) = cases(tmp_path / "cap.zarr")
    check(case, step, list(range(11, 21)))
    assert case.attrs["chunk"]["row_start"] == 11 and case.attrs["chunk"]["row_end"] == 21
    assert case.attrs["tensor_parallel"]["row_sharded"] is True
    assert case.attrs["tensor_parallel"]["shard_rows"] == [11, 21]
    assert case.attrs["row_window"] == {"tp_rank": 1, "start": 11, "end": 21}


def test_shardq_rows_of_034_keep_their_step_positions(vllm_0340_tree: Path, tmp_path: Path) -> None:
    """vLLM 0.34's ShardQ: rank 1 scores a zigzag slice of the step's rows, gathered compactly
    (`shardq_gather_indices`); each case says where its rows sit in the step."""
    step = prefill.make_step(TWO, seed=3)
    mine = [3, 4, 5, 14, 15, 16, 17]
    edges = Edges(tp_rank=1, tp_size=2)
    with plugin(vllm_0340_tree, tmp_path, edges) as capture:
        meta = prefill.metadata(step, [prefill.chunk(step, mine, 0)],
                                shardq_gather_indices=torch.tensor(mine, dtype=torch.int64))
        prefill.run(step, meta)
        capture.close()
    (case,) = cases(tmp_path / "cap.zarr")
    check(case, step, mine)
    assert case.attrs["row_positions"] == [[0, 3, 3], [3, 7, 14]] and "row_window" not in case.attrs
    assert case.attrs["tensor_parallel"] == {"tp_rank": 1, "tp_size": 2, "row_sharded": True,
                                             "row_sharding": "shardq", "step": 0}
    assert case.attrs["chunk"]["requests"] == 2


def test_deepselect_prefill_of_034_is_captured_as_bf16(vllm_0340_tree: Path, tmp_path: Path) -> None:
    step = prefill.make_step(TWO, seed=4)
    with plugin(vllm_0340_tree, tmp_path, Edges()) as capture:
        prefill.run(step, prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)]),
                    topk_backend="deep_select", logits_dtype=torch.bfloat16)
        capture.close()
    (case,) = cases(tmp_path / "cap.zarr")
    assert case.dtype == "bfloat16"
    check(case, step, list(range(21)))
    assert "DeepSelect" in case.attrs["reference_source"]
    paths = summary(tmp_path / "cap.zarr")["calls_by_path"]
    assert paths["deepselect"]["captured"] == 1 and "prefill" not in paths


def test_fused_topk_of_034_is_counted_as_not_capturable(vllm_0340_tree: Path, tmp_path: Path) -> None:
    step = prefill.make_step(TWO, seed=5)
    with plugin(vllm_0340_tree, tmp_path, Edges(fused=True)) as capture:
        buffer = prefill.run(step, prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)]))
        capture.close()
    assert (buffer >= 0).any()  # the fused kernel selected
    fused = summary(tmp_path / "cap.zarr")["calls_by_path"]["fused"]
    assert fused["not_capturable"] == 1 and "VLLM_USE_FUSED_MQA_TOPK=0" in fused["why_not_capturable"]
    assert not list(Archive.open(tmp_path / "cap.zarr").case_ids())


def test_dense_sub_windows_of_034_have_their_own_rows_and_requests(vllm_0340_tree: Path, tmp_path: Path) -> None:
    """A chunk planned for the fused kernel that takes the dense path runs in sub-windows of
    `dense_logits_rows` rows (here 1 MiB / (4 * 65536) = 4): each case is its window's."""
    step = prefill.make_step(TWO, seed=6)
    with plugin(vllm_0340_tree, tmp_path, Edges(fused=True, fused_chunks=False, logits_mb=1)) as capture:
        planned = prefill.chunk(step, list(range(21)), 0, max_seqlen_k=1 << 16)
        prefill.run(step, prefill.metadata(step, [planned]))
        capture.close()
    found = cases(tmp_path / "cap.zarr")
    assert [(c.attrs["chunk"]["row_start"], c.attrs["chunk"]["row_end"]) for c in found] == [
        (0, 4), (4, 8), (8, 12), (12, 16), (16, 20), (20, 21)]
    for c in found:
        rows = list(range(c.attrs["chunk"]["row_start"], c.attrs["chunk"]["row_end"]))
        check(c, step, rows)
        assert c.attrs["chunk"]["requests"] == len({step.owner[t][0] for t in rows})
        assert (c.attrs["chunk"]["token_start"], c.attrs["chunk"]["token_end"]) == (0, 21)


def test_v41_candidate_source_and_consumer_are_captured_with_their_facts(tree: Path, tmp_path: Path) -> None:
    """DeepSeek V4.1's two-level selection through the released op's candidate arguments: the source's
    top-k and its block selection (DeepSelect over per-block maxima), then a consumer whose logits were
    set to -inf outside those blocks before its top-k."""
    step = prefill.make_step(TWO, seed=9)
    blocks, size = 2, 4
    candidates = torch.full((21, blocks), -1, dtype=torch.int32)
    with plugin(tree, tmp_path, Edges()) as capture:
        meta = prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)])
        prefill.run(step, meta, layer=0, candidate_blocks=candidates, candidate_block_size=size,
                    candidate_write=True)
        prefill.run(step, meta, layer=1, candidate_blocks=candidates, candidate_block_size=size,
                    candidate_write=False)
        capture.close()
    found = {(c.attrs["k_cache_layer_index"], c.attrs["logits_kind"]): c for c in cases(tmp_path / "cap.zarr")}
    source, scores, consumer = (found[(0, "mqa_logits")], found[(0, "candidate_block_scores")],
                                found[(1, "mqa_logits")])
    check(source, step, list(range(21)))
    assert source.attrs["candidate"] == {"masked": False, "writes_candidates": True, "block_size": size,
                                         "source_layer": 0}
    assert scores.top_k == blocks and scores.attrs["candidate"]["block_size"] == size
    assert (scores.reference_indices == candidates.numpy()).all()
    assert consumer.attrs["candidate"]["masked"] is True
    for r in range(21):
        want = prefill.expected(step, r)
        keep = torch.zeros(want.numel(), dtype=torch.bool)
        for block in candidates[r].tolist():
            keep[block * size:(block + 1) * size] = block >= 0
        torch.testing.assert_close(consumer.row(r).float(), torch.where(keep, want, float("-inf")))


@pytest.mark.parametrize(("next_n", "per_row"), [(1, False), (2, True)], ids=["decode", "mtp"])
def test_decode_rows_are_captured_as_decode_cases(tree: Path, tmp_path: Path, next_n: int, per_row: bool) -> None:
    """The decode branch's `SparseIndexerTopk.forward` (released, resolving its backend on a CPU platform
    to per_row): one decode case of the batch's rows, each row's bounds by the context-length rule."""
    requests = [Request(30, next_n), Request(13, next_n), Request(21, next_n)]
    step = prefill.make_step(requests, seed=7)
    with plugin(tree, tmp_path, Edges()) as capture:
        buffer = prefill.run(step, prefill.decode_metadata(step, next_n, per_row))
        capture.close()
    (case,) = cases(tmp_path / "cap.zarr")
    check(case, step, list(range(len(requests) * next_n)))
    assert (case.reference_indices == buffer.numpy()).all()
    decode = case.attrs["decode"]
    assert case.attrs["kind"] == "decode" and case.attrs["chunk"]["requests"] == len(requests)
    assert (decode["next_n"], decode["backend"], decode["speculative"]) == (next_n, "per_row", next_n > 1)
    assert decode["max_model_len"] == case.cols == 4096
    assert summary(tmp_path / "cap.zarr")["calls_by_path"]["decode"]["captured"] == 1


def test_an_unknown_release_captures_nothing_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    import types

    from logitreplay.capture import vllm_plugin

    monkeypatch.setitem(__import__("sys").modules, "vllm", types.SimpleNamespace(__version__="0.35.0"))
    monkeypatch.setenv(serving.ENV_DIR, str(tmp_path / "cap.zarr"))
    vllm_plugin.register()
    try:
        assert "vLLM 0.35.0 is not a release the logitreplay capture plugin knows" in caplog.text
        assert isinstance(serving._active, VllmCapture) and not serving._active._patched
        serving._active.close()
    finally:
        serving._active = None
    assert "0.35.0" in summary(tmp_path / "cap.zarr")["engine_unsupported"]


SHARDS = {0: [0, 1, 2, 18, 19, 20, 9, 10, 11], 1: [3, 4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17]}


def _rank(tree: str, out: str, rank: int, port: int, scheme: str) -> None:
    """One TP rank of a two-rank step over gloo: the released indexer on this rank's rows, the plugin
    with ranks=auto."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        step = prefill.make_step(TWO, seed=8)
        with plugin(Path(tree), Path(out), Edges(tp_rank=rank, tp_size=2)) as capture:
            if scheme == "shardq":
                mine = sorted(SHARDS[rank])
                meta = prefill.metadata(step, [prefill.chunk(step, mine, 0)],
                                        shardq_gather_indices=torch.tensor(mine, dtype=torch.int64))
            elif scheme == "row_shard":
                meta = prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)], row_shard_sizes=[11, 10])
            else:
                meta = prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)])
            buffer = prefill.run(step, meta)
            capture.close()
        torch.save(buffer, Path(out) / f"buffer-{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize(("pin", "scheme"), [("vllm_0330_tree", "row_shard"), ("vllm_0340_tree", "shardq"),
                                             ("vllm_0340_tree", "replicated")])
def test_two_tp_ranks_over_gloo_capture_every_row_once(pin: str, scheme: str, tmp_path: Path,
                                                       request: pytest.FixtureRequest) -> None:
    """TP 2 in two processes over gloo: sharded rows are captured on both ranks, each case its rank's rows
    with their step positions, together every row of the chunk once; replicated rows on rank 0 alone."""
    import multiprocessing
    import socket

    tree = request.getfixturevalue(pin)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    procs = [context.Process(target=_rank, args=(str(tree), str(tmp_path), r, port, scheme)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    step = prefill.make_step(TWO, seed=8)
    found = cases(tmp_path / "cap.zarr")
    if scheme == "replicated":
        (case,) = found
        assert case.attrs["tensor_parallel"]["tp_rank"] == 0 and not case.attrs["tensor_parallel"]["row_sharded"]
        check(case, step, list(range(21)))
        return
    seen: list[int] = []
    for case in found:
        tp = case.attrs["tensor_parallel"]
        assert tp["row_sharded"] and tp["tp_size"] == 2
        if scheme == "shardq":
            rows = [p for first, end, start in case.attrs["row_positions"] for p in range(start, start + end - first)]
            assert rows == sorted(SHARDS[tp["tp_rank"]])
        else:
            rows = list(range(case.attrs["row_window"]["start"], case.attrs["row_window"]["end"]))
        check(case, step, rows)
        seen += rows
    assert sorted(seen) == list(range(21))
    if scheme == "shardq":  # `merge` puts the ranks' rows back together: one case of the step
        done = CliRunner().invoke(main, ["merge", str(tmp_path / "cap.zarr"), "--out", str(tmp_path / "m.zarr")])
        assert done.exit_code == 0, done.output
        (merged,) = cases(tmp_path / "m.zarr")
        check(merged, step, list(range(21)))
    if scheme == "row_shard":  # the ranks' indices were exchanged: both buffers hold every row's
        both = [torch.load(tmp_path / f"buffer-{r}.pt") for r in (0, 1)]
        assert torch.equal(both[0], both[1]) and (both[0] >= -1).all()
        shown = CliRunner().invoke(main, ["inspect", "--wide", str(tmp_path / "cap.zarr")])  # the windows
        assert shown.exit_code == 0 and "tp0 rows 0:11" in shown.output and "tp1 rows 11:21" in shown.output


class _Indexer:
    """What the plugin reads of a model's indexer module: its name and that it owns an indexer op."""

    def __init__(self, layer: int) -> None:
        self.prefix = f"model.layers.{layer}.self_attn.indexer"
        self.indexer_op = self  # any object: the layer owns one
        self.compress_ratio = None


class _Attention:
    """A DeepSeek V4.1 attention layer as the plugin sees it: its indexer, its candidate source layer, and a
    forward that runs the released op on another layer's key cache (`cache_layer`)."""

    def __init__(self, layer: int, candidate_source: int) -> None:
        self.indexer = _Indexer(layer)
        self.candidate_source_layer = candidate_source

    def forward(self, step: prefill.Step, meta: object, cache_layer: int, **candidate: object) -> torch.Tensor:
        return prefill.run(step, meta, layer=cache_layer, **candidate)


def test_v41_layers_sharing_a_key_cache_keep_their_own_identity(tree: Path, tmp_path: Path) -> None:
    """DeepSeek V4.1: layers 1 and 2 read layer 0's key cache and are consumers of its candidates. Each case
    is named after the layer that ran the op, the key cache it read is recorded separately, and its rows
    are its own step's recomputed logits (masked to the source's candidate blocks)."""
    steps = [prefill.make_step(TWO, seed=20 + i) for i in range(3)]
    blocks, size = 2, 4
    candidates = torch.full((21, blocks), -1, dtype=torch.int32)
    with plugin(tree, tmp_path, Edges()) as capture:
        for i, step in enumerate(steps):
            meta = prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)])
            _Attention(i, 0).forward(step, meta, 0, candidate_blocks=candidates, candidate_block_size=size,
                                     candidate_write=i == 0)
        capture.close()
    found = {(c.attrs["layer_index"], c.attrs["logits_kind"]): c for c in cases(tmp_path / "cap.zarr")}
    assert sorted(found) == [(0, "candidate_block_scores"), (0, "mqa_logits"), (1, "mqa_logits"), (2, "mqa_logits")]
    for (layer, _kind), case in found.items():
        a = case.attrs
        assert a["layer_name"] == f"model.layers.{layer}.self_attn.indexer" and a["layer_named_from"] == "indexer module"
        assert a["k_cache_prefix"] == prefill.PREFIX.format(0) and a["k_cache_layer_index"] == 0
        assert a["candidate"]["source_layer"] == 0 and a["candidate"]["masked"] is (layer > 0)
    check(found[(0, "mqa_logits")], steps[0], list(range(21)))
    for layer in (1, 2):
        consumer = found[(layer, "mqa_logits")]
        for r in range(21):
            want = prefill.expected(steps[layer], r)
            keep = torch.zeros(want.numel(), dtype=torch.bool)
            for block in candidates[r].tolist():
                keep[block * size:(block + 1) * size] = block >= 0
            torch.testing.assert_close(consumer.row(r).float(), torch.where(keep, want, float("-inf")))


def test_the_decode_op_called_directly_is_captured_once(tree: Path, tmp_path: Path) -> None:
    """Builds that call `top_k_per_row_decode` themselves (not through `SparseIndexerTopk.forward`): the
    op's own site makes one decode case, its bounds from seq_lens and next_n (2 here: a (batch, 1)
    seq_lens gives each request's rows the ends L - 1 and L)."""
    g = torch.Generator().manual_seed(30)
    logits = torch.randn(4, 64, generator=g)
    seq_lens = torch.tensor([[30], [64]], dtype=torch.int32)
    out = torch.empty(4, 16, dtype=torch.int32)
    with plugin(tree, tmp_path, Edges()) as capture:
        import vllm._custom_ops as ops

        ops.top_k_per_row_decode(logits, 2, seq_lens, out, 4, logits.stride(0), logits.stride(1), 16)
        capture.close()
    (case,) = cases(tmp_path / "cap.zarr")
    assert case.decode is not None and case.decode.seq_lens == ((30,), (64,)) and case.decode.backend == "per_row"
    assert case.row_ends.tolist() == [29, 30, 63, 64] and case.decode.max_seq_len == 64
    assert summary(tmp_path / "cap.zarr")["calls_by_path"]["decode"]["captured"] == 1
    for r, end in enumerate(case.row_ends.tolist()):
        assert torch.equal(case.row(r), logits[r, :end])
        assert set(case.reference_indices[r].tolist()) == set(torch.topk(logits[r, :end], 16).indices.tolist())


def test_nothing_is_staged_while_a_decode_graph_is_captured(vllm_0340_tree: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The graph check sees the decode call's logits (the forward's first argument is the module) and
    stops it before anything is staged."""
    asked: list[object] = []

    def capturing(t: object) -> bool:
        asked.append(t)
        return True

    monkeypatch.setattr(serving, "_capturing_graph", capturing)
    step = prefill.make_step([Request(30, 1), Request(13, 1)], seed=31)
    with plugin(vllm_0340_tree, tmp_path, Edges()) as capture:
        prefill.run(step, prefill.decode_metadata(step, 1, False))
        assert capture.writer is None
    assert asked and all(isinstance(t, torch.Tensor) for t in asked) and asked[0].shape[0] == 2
