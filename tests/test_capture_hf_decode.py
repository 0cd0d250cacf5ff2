"""Decode steps of transformers' `generate` captured as decode cases: through the CLI (`capture hf
--generate`), in a left-padded batch (rows rebased to column 0, as vLLM's paged cache presents them), and
without a host sync on the model's thread; every capture replays with `--strict`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.capture.hooks import IndexerCapture
from logitreplay.capture.policy import Policy, PolicyState
from logitreplay.capture.writer import CaptureWriter
from logitreplay.cli import main
from tests.test_capture_hf import TOP_K, ScoreTopk, _assert_reference_is_topk, _capture, _tiny, deepseek_dir
from tests.test_capture_sync import DEVICES, held, no_host_sync

pytest.importorskip("transformers", minversion="5.11")
__all__ = ["deepseek_dir"]  # the model fixture, shared with the prefill tests


def _replays_strict(archive: Path, tmp_path: Path) -> list[dict[str, object]]:
    report = tmp_path / "replay.json"
    result = CliRunner().invoke(main, ["replay", str(archive), "--strict", "--json", str(report)])
    assert result.exit_code == 0, result.output
    cases: list[dict[str, object]] = json.loads(report.read_text())["cases"]
    for case in cases:
        assert all(r["status"] == "ok" for r in case["results"]), case  # type: ignore[attr-defined]
    return cases


def test_generate_steps_are_decode_cases_and_replay_strict(deepseek_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    # One layer: 3 prefill chunks + 4 steps stay within the writer's queue (a full one drops, by design).
    summary = _capture([str(deepseek_dir), "--random-tokens", "40", "--chunk-size", "16", "--generate", "4",
                        "--policy", "layers=1,every", "--out", str(out)])
    assert summary["error"] is None and summary["generated"] == 4 and summary["dropped"] == {}
    cases = list(Archive.open(out))
    prefill = [c for c in cases if c.kind == "prefill"]
    decode = sorted((c for c in cases if c.kind == "decode"), key=lambda c: c.cols)
    # The prompt's last token is generate's first step: prefill stops one short, every step is one row.
    assert sorted({c.cols for c in prefill}) == [16, 32, 39]
    assert [(c.cols, c.attrs["layer_index"]) for c in decode] == [(w, 1) for w in range(40, 44)]
    for case in decode:
        facts = case.decode
        assert facts is not None and case.rows == 1 and case.top_k == TOP_K
        assert case.row_starts.tolist() == [0] and case.row_ends.tolist() == [case.cols]
        assert (facts.batch, facts.next_n, facts.seq_lens, facts.max_seq_len, facts.max_model_len) == \
            (1, 1, ((case.cols,),), case.cols, case.cols)
        assert facts.backend == "torch.topk" and not facts.speculative
        assert case.attrs["chunk"] == {"requests": 1, "sequence": 0, "generate": 4}
        _assert_reference_is_topk(case)
    replayed = _replays_strict(out, tmp_path)
    assert sum(c["kind"] == "decode" for c in replayed) == 4
    assert f"{deepseek_dir.name} layer 1 decode b1 n1 ctx 40-40" in {c["source"] for c in replayed}


def test_default_policy_keeps_one_decode_step_per_width_bucket(deepseek_dir: Path, tmp_path: Path) -> None:
    """Each step is one column wider (40 .. 43, one power-of-two bucket) at batch 1: the default keeps
    the first step of layer 1, where exact widths would keep all four."""
    out = tmp_path / "cap.zarr"
    summary = _capture([str(deepseek_dir), "--random-tokens", "40", "--chunk-size", "16", "--generate", "4",
                        "--policy", "layers=1", "--out", str(out)])
    assert summary["error"] is None and summary["dropped"] == {}
    decode = [c for c in Archive.open(out) if c.kind == "decode"]
    assert [(c.cols, c.rows) for c in decode] == [(40, 1)]


def _capture_generate(model: torch.nn.Module, out: Path, ids: torch.Tensor, mask: torch.Tensor,
                      steps: int) -> list[Case]:
    capture = IndexerCapture(CaptureWriter(out, PolicyState(Policy.parse("every"))))
    capture.attach(model)
    with torch.inference_mode():
        model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=steps, min_new_tokens=steps)
    summary = capture.close()
    assert summary["error"] is None and summary["dropped"] == {}, summary
    return list(Archive.open(out))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])  # boolean and additive float masks
def test_left_padded_batch_decode_rows_start_at_zero(attn: str, tmp_path: Path) -> None:
    model = _tiny("deepseek_v32", attn)
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0  # the second request is 4 tokens shorter: left-padded
    cases = _capture_generate(model, tmp_path / "cap.zarr", ids, mask, steps=3)
    decode = [c for c in cases if c.kind == "decode"]
    assert len(decode) == 2 * 2  # the steps after the prompt's forward, both layers
    for case in decode:
        width = case.cols
        assert case.rows == 2 and case.row_starts.tolist() == [0, 0]
        assert case.row_ends.tolist() == [width, width - 4]  # the padding is not the request's context
        assert case.decode is not None and case.decode.seq_lens == ((width,), (width - 4,))
        assert case.attrs["chunk"]["requests"] == 2
        _assert_reference_is_topk(case)
    _replays_strict(tmp_path / "cap.zarr", tmp_path)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_capture_never_syncs_the_model_thread(device: str, tmp_path: Path) -> None:
    """One query row per request, with a boolean, an additive and no mask: the decode facts come from
    shapes on the model's thread; the lengths are read and the rows rebased on the writer's thread."""
    model = torch.nn.ModuleDict({"scorer": ScoreTopk()})
    capture = IndexerCapture(CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every"))))
    capture.attach(model, pattern="scorer", classes=())
    g = torch.Generator().manual_seed(6)
    hidden, keys = torch.randn(2, 1, 8, generator=g).to(device), torch.randn(2, 10, 8, generator=g).to(device)
    window = torch.zeros(2, 1, 10, dtype=torch.bool)
    window[0, :, 2:7] = True  # request 0 attends to keys [2, 7)
    window[1, :, 3:] = True  # request 1 is left-padded by 3 keys
    masks = (window.to(device), torch.zeros(window.shape).masked_fill(~window, float("-inf")).to(device), None)
    positions = torch.tensor([[9], [6]], device=device)
    with held(capture.writer), no_host_sync(device):
        for mask in masks:
            model["scorer"](hidden, keys, mask, positions)
    summary = capture.close()
    assert summary["error"] is None and summary["captured"] == 3
    cases = sorted(Archive.open(tmp_path / "cap.zarr"), key=lambda c: c.case_id)
    assert [c.row_ends.tolist() for c in cases] == [[5, 7], [5, 7], [10, 7]]
    for case in cases:
        assert case.kind == "decode" and case.row_starts.tolist() == [0, 0] and case.cols == 10
        assert case.decode is not None and case.decode.seq_lens == tuple((int(e),) for e in case.row_ends)
        _assert_reference_is_topk(case)
    _replays_strict(tmp_path / "cap.zarr", tmp_path)
