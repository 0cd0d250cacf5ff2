"""vLLM 0.34's ShardQ cases (TP 2, each rank its zigzag share of a prefill step's rows) merged back by
`logitreplay merge CAPTURE --out MERGED` into one case per layer and step: captured inside the released
0.34.0 indexer as the TP 2 tests do (here the ranks one after the other in one process), and the merged
case checked against the logits, bounds and top-k recomputed from the step's inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive.case import Case
from logitreplay.archive.store import Archive
from logitreplay.cli import main
from tests.engine_fakes.vllm import prefill
from tests.engine_fakes.vllm.checks import cases, check, plugin
from tests.engine_fakes.vllm.edges import Edges
from tests.engine_fakes.vllm.prefill import Request

REQUESTS = [Request(20, 12), Request(0, 9)]
# Each rank's rows of the 21-row step; rank 0 scores its rows in two chunks.
SHARDS = {0: [[0, 1, 2, 9], [10, 11, 18, 19, 20]], 1: [[3, 4, 5, 6, 7, 8, 12, 13, 14, 15, 16, 17]]}


def _capture(tree: Path, out: Path, step: prefill.Step, rank: int, **options: object) -> None:
    """One TP rank's step through the released op with ShardQ metadata: its rows, gathered, in chunks."""
    mine = [t for chunk in SHARDS[rank] for t in chunk]
    with plugin(tree, out, Edges(tp_rank=rank, tp_size=2)) as capture:
        chunks, start = [], 0
        for rows in SHARDS[rank]:
            chunks.append(prefill.chunk(step, rows, start))
            start += len(rows)
        prefill.run(step, prefill.metadata(step, chunks, shardq_gather_indices=torch.tensor(mine)), **options)
        capture.close()


def _merge(src: Path, out: Path, *options: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["merge", str(src), "--out", str(out), *options])
    return result.exit_code, result.output


def _top_k_holds(case: Case, step: prefill.Step) -> None:
    """Each row's reference indices are a top-k of its recomputed logits: no unpicked value beats a picked
    one (beyond bfloat16's rounding for a bf16 case)."""
    slack = 2e-2 if case.dtype == "bfloat16" else 1e-5
    for r in range(case.rows):
        want = prefill.expected(step, r)
        picked = [int(i) for i in case.reference_indices[r] if i >= 0]
        rest = sorted(set(range(len(want))) - set(picked))
        if rest:
            assert float(want[picked].min()) >= float(want[rest].max()) - slack * max(1.0, float(want.abs().max()))


@pytest.mark.parametrize("options", [{}, {"topk_backend": "deep_select", "logits_dtype": torch.bfloat16}],
                         ids=["top_k_per_row_prefill", "deepselect-bf16"])
def test_the_ranks_shardq_cases_merge_into_one_case_of_the_step(vllm_0340_tree: Path, tmp_path: Path,
                                                               options: dict[str, object]) -> None:
    step = prefill.make_step(REQUESTS, seed=11)
    for rank in (0, 1):
        _capture(vllm_0340_tree, tmp_path, step, rank, **options)
    parts = cases(tmp_path / "cap.zarr")
    assert len(parts) == 3
    code, output = _merge(tmp_path / "cap.zarr", tmp_path / "merged.zarr")
    assert code == 0, output
    assert "1 ShardQ case merged from 3 parts" in output
    (merged,) = cases(tmp_path / "merged.zarr")
    assert merged.dtype == ("bfloat16" if options else "float32")
    check(merged, step, list(range(21)))  # every row of the step, in step order, with its bounds
    _top_k_holds(merged, step)
    assert merged.attrs["chunk"] == {"row_start": 0, "row_end": 21, "layout": "compressed"}
    assert merged.attrs["tensor_parallel"] == {"tp_size": 2, "row_sharded": False, "row_sharding": "shardq",
                                               "merged_from_ranks": [0, 1], "step": 0}
    shards = merged.attrs["shards"]
    assert sorted(s["case_id"] for s in shards) == sorted(p.case_id for p in parts)
    assert [s["tensor_parallel"]["tp_rank"] for s in shards] == [0, 0, 1]
    assert merged.cols == max(p.cols for p in parts) and merged.top_k == prefill.TOP_K
    replayed = CliRunner().invoke(main, ["replay", str(tmp_path / "merged.zarr"), "--strict"])
    assert replayed.exit_code == 0, replayed.output  # replay sees the one case, and it verifies
    by_id = {p.case_id: p for p in parts}
    for s in shards:  # each part's rows are the merged case's rows at its positions, exactly
        part = by_id[s["case_id"]]
        rows = [p for first, end, start in s["row_positions"] for p in range(start, start + end - first)]
        for r, p in enumerate(rows):
            assert torch.equal(part.row(r), merged.row(p))
            assert (part.reference_indices[r] == merged.reference_indices[p]).all()


@pytest.mark.parametrize("ranks", [(1,), (0, 1, 1)], ids=["a rank missing", "a rank twice"])
def test_parts_that_do_not_tile_the_step_are_kept_as_they_are_and_named(vllm_0340_tree: Path, tmp_path: Path,
                                                                       ranks: tuple[int, ...]) -> None:
    step = prefill.make_step(REQUESTS, seed=12)
    for rank in ranks:
        _capture(vllm_0340_tree, tmp_path, step, rank)
    source = Archive.open(tmp_path / "cap.zarr")
    why = "every rank's rows are needed" if ranks == (1,) else "is repeated"
    code, output = _merge(tmp_path / "cap.zarr", tmp_path / "merged.zarr")
    assert code == 0 and "0 ShardQ cases merged" in output
    assert "not merged: " in output and why in output  # named, with the reason
    copied = Archive.open(tmp_path / "merged.zarr")
    assert sorted(copied.case_ids()) == sorted(source.case_ids())  # no part lost, none changed
    assert all(copied.read(c).sha256() == source.read(c).sha256() for c in source.case_ids())
    code, output = _merge(tmp_path / "cap.zarr", tmp_path / "strict.zarr", "--strict")
    assert code == 1 and len(output.strip().splitlines()) == 1 and why in output
    assert not (tmp_path / "strict.zarr").exists() and len(source.case_ids()) > 0


def test_cases_that_are_no_shardq_parts_are_copied_as_they_are(vllm_0340_tree: Path, tmp_path: Path) -> None:
    step = prefill.make_step(REQUESTS, seed=13)
    with plugin(vllm_0340_tree, tmp_path, Edges()) as capture:
        prefill.run(step, prefill.metadata(step, [prefill.chunk(step, list(range(21)), 0)]))
        capture.close()
    (whole,) = cases(tmp_path / "cap.zarr")
    code, output = _merge(tmp_path / "cap.zarr", tmp_path / "merged.zarr")
    assert code == 0 and "0 ShardQ cases merged" in output
    (copied,) = cases(tmp_path / "merged.zarr")
    assert copied.case_id == whole.case_id and copied.sha256() == whole.sha256() and copied.attrs == whole.attrs
    assert _merge(tmp_path / "cap.zarr", tmp_path / "merged.zarr")[0] == 1  # never over an existing one
