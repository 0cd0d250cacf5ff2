"""DeepSeek V4.1's sparse-logits path (`attention_config.indexer_sparse_logits`) inside the released vLLM
0.33.0 and 0.34.0: a candidate consumer's `SparseMQAIndexer.forward` -> `sparse_mqa_logits_prefill_chunk`
-> `sparse_topk_remap` -> `deep_select_topk` over bf16 logits of its candidate tokens only, with CPU fakes
only at the kernel boundary (tests/engine_fakes/vllm/sparse_edges.py). Every captured case is checked
against the sparse logits recomputed from the step's inputs and the published candidate blocks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from logitreplay.cli import main
from tests.engine_fakes.vllm import prefill, sparse
from tests.engine_fakes.vllm.checks import cases, plugin, summary
from tests.engine_fakes.vllm.edges import Edges
from tests.engine_fakes.vllm.prefill import Request
from tests.engine_fakes.vllm.sparse_edges import sparse_fakes

# B's keys start at 312 in the first chunk's workspace: not a multiple of the sparse block (16)
REQUESTS = [Request(300, 12), Request(180, 9), Request(40, 5)]
CHUNKS = [(list(range(21)), 0), (list(range(21, 26)), 21)]  # A and B, then C
RELEASES = [pytest.param("vllm_0330_tree", "mxfp4", id="0.33.0-mxfp4"),
            pytest.param("vllm_0340_tree", "mxfp4", id="0.34.0-mxfp4"),
            pytest.param("vllm_0340_tree", "fp8", id="0.34.0-fp8")]


def _capture(tree: Path, kv_dtype: str, tmp_path: Path) -> tuple[sparse.SparseStep, dict[int, torch.Tensor]]:
    """Layers 1 and 2 consume layer 0's candidates and read its key cache, over two chunks; layer 2 reuses
    the candidate expansion layer 1 made (the builder's scratch). The step, and vLLM's top-k buffer after
    each layer."""
    edges = Edges()
    s = sparse.make_step(REQUESTS, kv_dtype, seed=40)
    written: dict[int, torch.Tensor] = {}
    with plugin(tree, tmp_path, edges, modules=sparse_fakes(edges, kv_dtype)) as capture:
        meta = sparse.metadata(s, [prefill.chunk(s.step, rows, start) for rows, start in CHUNKS])
        buffer = torch.full((len(s.step.owner), sparse.TOP_K), -7, dtype=torch.int32)
        for layer in (1, 2):
            sparse.Attention(layer, 0, s, buffer).forward(s, meta)
            written[layer] = buffer.clone()
        capture.close()
    return s, written


@pytest.mark.parametrize(("pin", "kv_dtype"), RELEASES)
def test_v41_sparse_logits_are_captured_as_bf16_candidate_columns(pin: str, kv_dtype: str, tmp_path: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    """Each case is one layer's chunk: bf16 logits of the candidate tokens, bounds [0, end), DeepSelect's
    columns as reference indices, and the facts to read them by (the sparse block size, the candidates)."""
    s, written = _capture(request.getfixturevalue(pin), kv_dtype, tmp_path)
    found = {(c.attrs["layer_index"], c.attrs["chunk"]["token_start"]): c for c in cases(tmp_path / "cap.zarr")}
    assert sorted(found) == [(1, 0), (1, 21), (2, 0), (2, 21)]
    for (layer, start), case in found.items():
        a = case.attrs
        assert a["logits_kind"] == "sparse_mqa_logits" and case.dtype == "bfloat16" and case.top_k == sparse.TOP_K
        assert a["sparse_logits"]["dtype"] == "bfloat16" and a["sparse_block_kv"] == 16
        assert case.cols == sparse.CANDIDATES * sparse.CANDIDATE_BLOCK
        assert a["candidate"] == {"masked": True, "scored": "candidate blocks only",
                                  "block_size": sparse.CANDIDATE_BLOCK, "source_layer": 0}
        assert a["layer_name"] == f"model.layers.{layer}.self_attn.indexer" and a["layer_named_from"] == "indexer module"
        assert a["k_cache_prefix"] == sparse.PREFIX.format(0) and a["k_cache_layer_index"] == 0
        assert a["index_source"] == "input of vLLM deep_select_topk" and "DeepSelect" in a["reference_source"]
        chunk = a["chunk"]
        assert chunk["layout"] == "sparse_candidates" and chunk["token_end"] == start + case.rows
        assert (chunk["requests"], chunk["row_key_offsets"]) == (
            (2, [[0, 12, 0], [12, 21, 312]]) if start == 0 else (1, [[0, 5, 0]]))
        for r in range(case.rows):
            token = start + r
            keys = sparse.sparse_columns(s, token)
            want = sparse.expected(s, token, keys)
            assert (int(case.row_starts[r]), int(case.row_ends[r])) == (0, len(keys))
            assert torch.equal(case.row(r), want)
            reference = case.reference_indices[r].tolist()
            picked = [c for c in reference if c >= 0]
            assert len(set(picked)) == len(picked) == min(sparse.TOP_K, len(keys))
            assert reference[len(picked):] == [-1] * (sparse.TOP_K - len(picked))
            top = torch.topk(want.float(), len(picked)).values
            assert torch.equal(want[picked].float().sort().values, top.sort().values)
            # the columns are the ones vLLM mapped back to request-local keys
            assert [keys[c] if c >= 0 else -1 for c in reference] == written[layer][token].tolist()
    assert summary(tmp_path / "cap.zarr")["calls_by_path"]["sparse_logits"]["captured"] == 4


@pytest.mark.slow
def test_v41_sparse_logits_cases_replay_strict(vllm_0340_tree: Path, tmp_path: Path) -> None:
    """The captured cases replay with --strict: every selector's indices verified against the rows."""
    _capture(vllm_0340_tree, "mxfp4", tmp_path)
    replayed = CliRunner().invoke(main, ["replay", str(tmp_path / "cap.zarr"), "--strict"])
    assert replayed.exit_code == 0, replayed.output


@pytest.mark.parametrize("pin", ["vllm_0330_tree", "vllm_0340_tree"], ids=["0.33.0", "0.34.0"])
def test_v41_sparse_decode_rows_are_counted_as_not_captured(pin: str, tmp_path: Path,
                                                          request: pytest.FixtureRequest) -> None:
    """The sparse path's decode rows (`sparse_mqa_logits_paged_decode`) are not captured: each call is
    counted in the run summary with why, and nothing is stored."""
    tree, edges = request.getfixturevalue(pin), Edges()
    s = sparse.make_step(REQUESTS, "mxfp4", seed=41)
    last = [sum(r.query for r in REQUESTS[:b + 1]) - 1 for b in range(len(REQUESTS))]
    buffer = torch.full((len(last), sparse.TOP_K), -7, dtype=torch.int32)
    with plugin(tree, tmp_path, edges, modules=sparse_fakes(edges, "mxfp4")) as capture:
        sparse.Attention(1, 0, s, buffer, rows=last).forward(s, sparse.decode_metadata(s))
        capture.close()
    for row, token in enumerate(last):  # vLLM's top-k ran: each row's keys among its candidates'
        keys = sparse.sparse_columns(s, token)
        chosen = [k for k in buffer[row].tolist() if k >= 0]
        assert len(chosen) == min(sparse.TOP_K, len(keys)) and set(chosen) <= set(keys)
    paths = summary(tmp_path / "cap.zarr")["calls_by_path"]
    assert paths["sparse_logits"]["not_capturable"] == 1 and paths["sparse_logits"]["captured"] == 0
    assert "sparse_mqa_logits_paged_decode" in paths["sparse_logits"]["why_not_capturable"]
    assert not cases(tmp_path / "cap.zarr")
