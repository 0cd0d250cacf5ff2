"""The vLLM plugin on DeepSeek V4.1's layer topology (tests/vllm033, shaped like vLLM 0.33's
models/deepseek_v41/attention.py): index sources sharing another layer's key cache, the candidate source
and its consumers (masked logits), and the sparse-logits path where `deep_select_topk`, imported by name,
runs on bf16 logits of the candidate tokens only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_plugin import VllmCapture
from logitreplay.cli import main
from tests.vllm033.steps import prefill_step, run, v41_model

# DeepSelect's alignment: 32 candidate blocks of 16 give bf16 sparse rows of 512 columns (1024 B)
RATIO, TOP_K, BLOCK, CANDIDATES, BLOCK_KV = 2, 8, 16, 32, 8
REQUESTS = [(1100, 10), (700, 12)]  # compressed: 550 and 350 keys; request B's keys start at 550


pytestmark = pytest.mark.usefixtures("vllm033", "fresh_plugin")


def _model(sparse_logits: bool) -> list[Any]:
    # layer 0: kv source, index source, candidate source; layers 1, 2: index sources reading layer 0's keys
    return v41_model(3, kv_sources=(0,), index_sources=(0, 1, 2), candidate_source=0, sparse_logits=sparse_logits,
                     ratio=RATIO, top_k=TOP_K, keys=900, candidate_topk_blocks=CANDIDATES,
                     candidate_block_size=BLOCK)


def _forward(tmp_path: Path, sparse_logits: bool) -> tuple[list[Case], list[Any], list[Any]]:
    capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse("every"))
    capture.install()
    layers, steps = _model(sparse_logits), []
    kv = layers[0].indexer.k_cache.kv_cache
    for i, layer in enumerate(layers):
        sparse = (CANDIDATES * BLOCK // BLOCK_KV, TOP_K, BLOCK_KV) if sparse_logits and i > 0 else None
        steps.append(step := prefill_step(REQUESTS, kv, ratio=RATIO, seed=i, sparse=sparse))
        run(layer, step)
    summary = capture.close()
    assert summary is not None and summary["error"] is None
    archive = Archive.open(tmp_path / "cap.zarr")
    return sorted((archive.read(c) for c in archive.case_ids()), key=lambda c: c.case_id), layers, steps


def test_layers_sharing_a_key_cache_keep_their_own_identity_and_candidate_facts(tmp_path: Path) -> None:
    cases, layers, steps = _forward(tmp_path, sparse_logits=False)
    kinds = [(c.attrs["layer_name"], c.attrs["logits_kind"]) for c in cases]
    assert kinds == [("model.layers.0.self_attn.indexer", "candidate_block_scores"),
                     ("model.layers.0.self_attn.indexer", "mqa_logits"),
                     ("model.layers.1.self_attn.indexer", "mqa_logits"),
                     ("model.layers.2.self_attn.indexer", "mqa_logits")]
    blocks, source, consumer = cases[0], cases[1], cases[2]
    for case in cases:
        a = case.attrs
        assert a["k_cache_prefix"] == "model.layers.0.self_attn.indexer.k_cache" and a["k_cache_layer_index"] == 0
        assert a["compress_ratio"] == RATIO and a["layer_named_from"] == "indexer module"
        assert a["chunk"]["requests"] == 2 and a["chunk"]["row_key_offsets"] == [[0, 10, 0], [10, 22, 550]]
    assert [c.attrs["layer_index"] for c in cases] == [0, 0, 1, 2]
    assert source.attrs["candidate"] == {"masked": False, "writes_candidates": True, "block_size": BLOCK,
                                         "source_layer": 0}
    assert consumer.attrs["candidate"] == {"masked": True, "writes_candidates": False, "block_size": BLOCK,
                                           "source_layer": 0}
    # compressed columns: ke - ks = (start_pos + 1 + offset) // 2
    assert source.row_ends.tolist() == [(1090 + 1 + i) // 2 for i in range(10)] + [(688 + 1 + i) // 2 for i in range(12)]
    # the consumer's logits were masked to -inf outside its candidate blocks, in place, before the top-k
    seen = steps[1].seen[-1]
    for r in range(consumer.rows):
        row, raw = consumer.row(r), seen[r, : int(consumer.row_ends[r])]
        finite = torch.isfinite(row)
        assert torch.equal(row[finite], raw[finite]) and 0 < int(finite.sum()) <= CANDIDATES * BLOCK
    # the candidate source's block scores: per-block maxima of its logits, DeepSelect over [0, valid blocks)
    raw0 = steps[0].seen[-1]
    assert blocks.cols == 35 and blocks.top_k == CANDIDATES and blocks.row_ends.tolist() == [
        -(-int(e) // BLOCK) for e in source.row_ends]
    for r in range(blocks.rows):
        n = int(source.row_ends[r])
        expect = torch.nn.functional.pad(raw0[r, :n], (0, -n % BLOCK), value=float("-inf")).view(-1, BLOCK).amax(-1)
        assert torch.equal(blocks.row(r), expect)
    published = layers[0].indexer.indexer_op.candidate_blocks[: steps[0].tokens]
    assert blocks.reference_indices is not None and (blocks.reference_indices == published.numpy()).all()
    result = CliRunner().invoke(main, ["replay", str(tmp_path / "cap.zarr"), "--strict"])
    assert result.exit_code == 0, result.output


def test_sparse_logits_path_is_captured_as_bf16_sparse_logits(tmp_path: Path) -> None:
    cases, layers, steps = _forward(tmp_path, sparse_logits=True)
    sparse = [c for c in cases if c.attrs["logits_kind"] == "sparse_mqa_logits"]
    assert [c.attrs["layer_name"] for c in sparse] == ["model.layers.1.self_attn.indexer",
                                                       "model.layers.2.self_attn.indexer"]
    for case, step in zip(sparse, steps[1:], strict=True):
        a = case.attrs
        assert case.dtype == "bfloat16" and a["sparse_logits"]["dtype"] == "bfloat16"
        assert a["index_source"] == "input of vLLM deep_select_topk" and a["sparse_block_kv"] == BLOCK_KV
        assert a["candidate"]["masked"] and a["candidate"]["source_layer"] == 0
        assert a["k_cache_prefix"] == "model.layers.0.self_attn.indexer.k_cache"
        assert a["chunk"]["requests"] == 2 and a["chunk"]["layout"] == "sparse_candidates"
        rows = step.metadata.sparse_prefill[0]
        assert case.cols == CANDIDATES * BLOCK and case.row_ends.tolist() == rows.end.tolist()
        seen = step.seen[-1]
        for r in range(case.rows):
            n = int(rows.end[r])
            assert torch.equal(case.row(r).view(torch.int16), seen[r, :n].view(torch.int16))
        assert case.reference_indices is not None
        assert (case.reference_indices == rows.col_indices.numpy()).all()
        assert np.all((case.reference_indices >= -1) & (case.reference_indices < case.cols))
    result = CliRunner().invoke(main, ["replay", str(tmp_path / "cap.zarr"), "--strict"])
    assert result.exit_code == 0, result.output
