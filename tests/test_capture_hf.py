"""Capture from transformers models: tiny random-initialised DeepSeek-V3.2 and GLM MoE DSA checkpoints,
saved with `save_pretrained` and captured through the real CLI, then checked against what the indexer
module itself selected, replayed with every selector, and probed for the hook behaviours users rely on
(mask kinds, left padding, policy, errors that must never reach the forward)."""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.capture import hooks
from logitreplay.capture.hooks import IndexerCapture
from logitreplay.capture.policy import Policy, PolicyState
from logitreplay.capture.writer import CaptureWriter
from logitreplay.cli import main
from tests.test_capture_sync import DEVICES, held, no_host_sync

transformers = pytest.importorskip("transformers", minversion="5.11")

TOP_K = 32
_COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=2, n_routed_experts=4, n_shared_experts=1,
               num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, q_lora_rank=16,
               kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, index_n_heads=4,
               index_head_dim=16, index_topk=TOP_K, max_position_embeddings=1024)
ARCHS = {"deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM"),
         "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM")}


def _tiny(arch: str, attn: str = "sdpa") -> torch.nn.Module:
    config_cls, model_cls = (getattr(transformers, n) for n in ARCHS[arch])
    torch.manual_seed(0)
    config = config_cls(**_COMMON)
    config._attn_implementation = attn
    return model_cls(config).eval()


def _saved(arch: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp(arch)
    _tiny(arch).save_pretrained(path)
    assert (path / "model.safetensors").is_file()
    return path


@pytest.fixture(scope="module", params=sorted(ARCHS))
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _saved(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _saved("deepseek_v32", tmp_path_factory)


def _capture(args: list[str]) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["capture", "hf", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def _assert_reference_is_topk(case: Case) -> None:
    """The values at the module's own indices are exactly the top-k of each captured row."""
    assert case.reference_indices is not None
    for r in range(case.rows):
        row = case.row(r)
        ref = torch.from_numpy(case.reference_indices[r]).long()
        k = min(case.top_k, row.numel())
        assert (ref[:k] >= 0).all() and (ref[k:] == -1).all()
        picked = row[ref[:k]].sort().values
        assert torch.equal(picked, row.topk(k).values.sort().values), f"{case.case_id} row {r}"


def test_capture_hf_through_the_cli(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.zarr"
    summary = _capture([str(model_dir), "--random-tokens", "192", "--chunk-size", "64", "--out", str(out)])
    layers = ["model.layers.0.self_attn.indexer", "model.layers.1.self_attn.indexer"]
    assert summary["captured"] == 6 and summary["error"] is None and summary["dropped"] == {}
    assert summary["widths"] == {name: [64, 128, 192] for name in layers}

    archive = Archive.open(out)
    cases = list(archive)
    assert len(cases) == 6
    for case in cases:
        chunk = case.cols // 64 - 1
        assert case.rows == 64 and case.top_k == TOP_K and case.row_stride == case.cols
        assert case.row_starts.tolist() == [0] * 64  # one request, no padding
        assert case.row_ends.tolist() == [64 * chunk + r + 1 for r in range(64)]  # causal: past + own position
        a = case.attrs
        assert a["model"] == str(model_dir.resolve()) and a["model_source"] == "local" and a["revision"] is None
        assert a["engine"] == "transformers" and a["engine_version"] == transformers.__version__
        assert a["layer_name"] in layers and a["layer_index"] == layers.index(a["layer_name"])
        assert a["chunk"] == {"requests": 1, "sequence": 0, "token_start": 64 * chunk, "token_end": 64 * (chunk + 1)}
        assert a["device"] == "cpu" and a["capture_policy"]["mode"] == "first_per_layer_width"
        _assert_reference_is_topk(case)


def test_a_spent_budget_ends_the_run(tmp_path: Path, deepseek_dir: Path) -> None:
    summary = _capture([str(deepseek_dir), "--random-tokens", "192", "--chunk-size", "64", "--policy", "every",
                        "--policy", "max-cases=2", "--out", str(tmp_path / "cap.zarr")])
    assert summary["captured"] == 2 and summary["dropped"] == {}
    assert summary["tokens"] == 192 and summary["tokens_run"] == 64  # both layers of chunk 1: nothing left to keep
    result = CliRunner().invoke(main, ["capture", "hf", str(deepseek_dir), "--random-tokens", "192", "--chunk-size",
                                       "64", "--policy", "max-cases=2", "--out", str(tmp_path / "b.zarr")])
    said = " ".join(result.output.split())  # the summary's lines wrap within 80 columns
    assert result.exit_code == 0 and "64 of 192 tokens (stopped: nothing more to keep)" in said


def test_capture_then_replay_verifies_every_selector(tmp_path: Path, deepseek_dir: Path) -> None:
    out = tmp_path / "cap.zarr"
    _capture([str(deepseek_dir), "--random-tokens", "96", "--chunk-size", "48", "--out", str(out)])
    report = tmp_path / "replay.csv"
    result = CliRunner().invoke(main, ["replay", str(out), "--strict", "--csv", str(report)])
    assert result.exit_code == 0, result.output
    lines = list(csv.DictReader(report.open()))
    assert {line["selector"] for line in lines} == {"reference", "native", "deepselect"}
    assert len(lines) == 4 * 3 and all(line["status"] == "ok" for line in lines), lines


def _run(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask).logits  # type: ignore[no-any-return]


def _capture_in_process(model: torch.nn.Module, out: Path, ids: torch.Tensor, mask: torch.Tensor | None,
                        policy: str = "every") -> tuple[IndexerCapture, list[Case]]:
    capture = IndexerCapture(CaptureWriter(out, PolicyState(Policy.parse(policy))))
    capture.attach(model)
    _run(model, ids, mask)
    capture.close()
    return capture, list(Archive.open(out))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])  # boolean and additive float masks
def test_left_padding_gives_per_row_starts(attn: str, tmp_path: Path) -> None:
    model = _tiny("deepseek_v32", attn)
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, :7] = 0  # second request left-padded by 7 tokens
    _, cases = _capture_in_process(model, tmp_path / "cap.zarr", ids, mask)
    assert len(cases) == 2
    for case in cases:
        assert case.rows == 80 and case.cols == 40 and case.attrs["chunk"]["requests"] == 2
        starts, ends = case.row_starts.tolist(), case.row_ends.tolist()
        assert starts[:40] == [0] * 40 and ends[:40] == list(range(1, 41))
        assert starts[40:47] == ends[40:47] == [0] * 7  # padding queries attend to nothing: empty rows
        assert starts[47:] == [7] * 33 and ends[47:] == list(range(8, 41))
        _assert_reference_is_topk(case)


def test_float_and_boolean_masks_capture_identical_values(tmp_path: Path) -> None:
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(2))
    _, sdpa = _capture_in_process(_tiny("glm_moe_dsa", "sdpa"), tmp_path / "a.zarr", ids, None)
    _, eager = _capture_in_process(_tiny("glm_moe_dsa", "eager"), tmp_path / "b.zarr", ids, None)
    for a, b in zip(sdpa, eager, strict=True):
        assert (a.row_starts == b.row_starts).all() and (a.row_ends == b.row_ends).all()
        assert a.values.tobytes() == b.values.tobytes()


def test_unwanted_calls_never_enter_the_function_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _tiny("deepseek_v32")
    entered = []
    real_enter = hooks._TopkRecorder.__enter__
    monkeypatch.setattr(hooks._TopkRecorder, "__enter__", lambda self: entered.append(1) or real_enter(self))
    capture = IndexerCapture(CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("layers=1"))))
    capture.attach(model)
    ids = torch.randint(0, 128, (1, 24))
    plain = _run(_tiny("deepseek_v32"), ids)
    for _ in range(3):  # default policy: layer 1 at width 24 once; every other call is refused by shape
        assert torch.equal(_run(model, ids), plain)
    summary = capture.close()
    assert len(entered) == 1 and summary["captured"] == 1
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())  # detached


def test_errors_inside_capture_never_reach_the_forward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    model = _tiny("deepseek_v32")
    capture = IndexerCapture(CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every"))))
    capture.attach(model)

    def broken_submit(*args: Any, **kwargs: Any) -> bool:
        raise RuntimeError("unexpected tensor layout")

    monkeypatch.setattr(capture.writer, "submit", broken_submit)
    ids = torch.randint(0, 128, (1, 16))
    expected = _run(_tiny("deepseek_v32"), ids)
    assert torch.equal(_run(model, ids), expected)
    assert torch.equal(_run(model, ids), expected)
    assert "unexpected tensor layout" in (capture.error or "") and not capture.enabled
    assert len([r for r in caplog.records if "capture disabled" in r.getMessage()]) == 1
    assert capture.close()["captured"] == 0


def test_a_raising_forward_leaves_no_function_mode_behind(tmp_path: Path) -> None:
    model = _tiny("deepseek_v32")
    capture = IndexerCapture(CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every"))))
    capture.attach(model)
    indexer = model.model.layers[0].self_attn.indexer
    hidden = torch.randn(1, 4, 32)
    with pytest.raises(Exception):  # noqa: B017 - any failure inside the module's own forward
        indexer(hidden, torch.randn(1, 4, 999), (torch.ones(1, 4, 8), torch.zeros(1, 4, 8)),
                torch.ones(1, 4, 4, dtype=torch.bool), None)
    assert torch._C._len_torch_function_stack() == 0
    assert capture.error is None  # the model's own error is the model's business
    capture.close()


def test_cli_rejects_bad_input_in_one_line(tmp_path: Path, deepseek_dir: Path) -> None:
    model_dir = deepseek_dir
    runner = CliRunner()
    r = runner.invoke(main, ["capture", "hf", str(model_dir), "--out", str(tmp_path / "a.zarr")])
    assert r.exit_code == 2 and "exactly one of --prompts FILE or --random-tokens N" in r.output
    r = runner.invoke(main, ["capture", "hf", str(model_dir), "--random-tokens", "8", "--policy", "sometimes",
                             "--out", str(tmp_path / "b.zarr")])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "'sometimes': unknown" in r.output
    r = runner.invoke(main, ["capture", "hf", str(tmp_path / "missing"), "--random-tokens", "8",
                             "--out", str(tmp_path / "c.zarr")])
    assert r.exit_code == 1 and r.output.startswith("Error: ") and "cannot load" in r.output


def test_prompts_run_as_sequences_cut_to_context_len(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    vocab = {w: i for i, w in enumerate(["[UNK]", *dict.fromkeys(words)])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    model = tmp_path / "model"
    _tiny("glm_moe_dsa").save_pretrained(model)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer).save_pretrained(model)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(" ".join(words * 3) + "\n\n" + " ".join(words[:5] * 2) + "\n")  # 27 and 10 tokens
    out = tmp_path / "cap.zarr"
    summary = _capture([str(model), "--prompts", str(prompts), "--context-len", "16", "--chunk-size", "8",
                        "--out", str(out)])
    assert summary["sequences"] == 2 and summary["tokens"] == 16 + 10
    # default policy: sequence 0 gives widths 8 and 16, sequence 1 adds only width 10 (8 was taken)
    assert all(widths == [8, 10, 16] for widths in summary["widths"].values())
    chunks = sorted((c.attrs["chunk"]["sequence"], c.cols) for c in Archive.open(out))
    assert chunks == [(0, 8), (0, 8), (0, 16), (0, 16), (1, 10), (1, 10)]


@pytest.mark.slow
def test_hub_model_records_the_cached_snapshot_sha_offline(tmp_path: Path, deepseek_dir: Path) -> None:
    """A hub id loaded offline from the cache records the exact commit of the snapshot it resolved to."""
    import os
    import shutil
    import subprocess
    import sys

    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--tiny-org--tiny-dsa"
    shutil.copytree(deepseek_dir, repo / "snapshots" / sha)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(sha)
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / "cap.zarr"
    proc = subprocess.run([sys.executable, "-c", "from logitreplay.cli import main; main()", "capture", "hf", "tiny-org/tiny-dsa",
                           "--random-tokens", "16", "--chunk-size", "16", "--out", str(out), "--json"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["revision"] == sha
    for case in Archive.open(out):
        a = case.attrs
        assert a["model"] == "tiny-org/tiny-dsa" and a["model_source"] == "hub" and a["revision"] == sha


class ScoreTopk(torch.nn.Module):
    """A user's own indexer: scores the keys it is given under a boolean or additive mask; when no mask is
    passed it masks the keys after each query's position itself (as transformers 5.11 indexers do when
    attention is plainly causal)."""

    def forward(self, hidden_states: torch.Tensor, keys: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        scores = hidden_states @ keys.transpose(1, 2)
        if attention_mask is None:
            assert position_ids is not None
            after = torch.arange(keys.shape[1], device=keys.device) > position_ids[..., None]
            scores = scores.masked_fill(after, float("-inf"))
        elif attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        else:
            scores = scores + attention_mask
        return scores.topk(min(4, keys.shape[1]), dim=-1).indices


def test_modules_named_by_pattern_with_or_without_a_mask(tmp_path: Path) -> None:
    model = torch.nn.ModuleDict({"blocks": torch.nn.ModuleList([torch.nn.ModuleDict({"scorer": ScoreTopk()})])})
    scorer = model["blocks"][0]["scorer"]
    capture = IndexerCapture(CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every"))))
    assert capture.attach(model, pattern=r"blocks\.\d+\.scorer", classes=()) == ["blocks.0.scorer"]
    g = torch.Generator().manual_seed(3)
    hidden, keys = torch.randn(1, 6, 8, generator=g), torch.randn(1, 10, 8, generator=g)
    scorer(hidden, keys, position_ids=torch.arange(4, 10)[None])  # the last 6 of 10 tokens, no mask
    window = torch.zeros(1, 6, 10, dtype=torch.bool)
    window[0, :, 2:7] = True  # an explicit mask: every query attends to keys [2, 7)
    scorer(hidden, keys, window)
    summary = capture.close()
    assert summary["captured"] == 2 and summary["error"] is None
    causal, windowed = sorted(Archive.open(tmp_path / "cap.zarr"), key=lambda c: c.case_id)
    assert causal.row_starts.tolist() == [0] * 6 and causal.row_ends.tolist() == list(range(5, 11))
    assert windowed.row_starts.tolist() == [2] * 6 and windowed.row_ends.tolist() == [7] * 6
    for case in (causal, windowed):
        assert case.top_k == 4 and case.attrs["layer_name"] == "blocks.0.scorer" and case.attrs["layer_index"] == 0
        _assert_reference_is_topk(case)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["", "every"])
def test_capture_never_syncs_the_model_thread(device: str, policy: str, tmp_path: Path) -> None:
    """Boolean, additive and absent masks, wanted and refused calls: bounds, reference indices and staging
    all stay on the device; the writer reads them later, on its own thread."""
    model = torch.nn.ModuleDict({"scorer": ScoreTopk()})
    capture = IndexerCapture(CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse(policy))))
    capture.attach(model, pattern="scorer", classes=())
    g = torch.Generator().manual_seed(4)
    hidden, keys = torch.randn(2, 6, 8, generator=g).to(device), torch.randn(2, 10, 8, generator=g).to(device)
    window = torch.zeros(2, 6, 10, dtype=torch.bool)
    window[0, :, 2:7] = True  # request 0 attends to keys [2, 7)
    window[1, 1:, 3:] = True  # request 1 is left-padded by 3 keys, and its first query is padding
    masks = (window.to(device), torch.zeros(window.shape).masked_fill(~window, float("-inf")).to(device), None)
    positions = torch.arange(4, 10, device=device).expand(2, 6)
    with held(capture.writer), no_host_sync(device):
        for _ in range(2):
            for mask in masks:
                model["scorer"](hidden, keys, mask, positions)
    summary = capture.close()
    assert summary["error"] is None and summary["dropped"] == {}
    cases = sorted(Archive.open(tmp_path / "cap.zarr"), key=lambda c: c.case_id)
    assert len(cases) == (6 if policy else 1)  # default: the first call of width 10, decided from shapes
    for case in cases[:2 if policy else 1]:
        assert case.row_starts.tolist() == [2] * 6 + [0, 3, 3, 3, 3, 3]
        assert case.row_ends.tolist() == [7] * 6 + [0, 10, 10, 10, 10, 10]
    for case in cases:
        assert case.attrs["chunk"] == {"requests": 2}
        _assert_reference_is_topk(case)


def test_a_mask_with_holes_stops_capture_with_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The bounds are checked on the writer thread (reading them on the model's thread would be a sync):
    a row attending to a non-contiguous set of columns turns capture off there, never in the forward."""
    model = torch.nn.ModuleDict({"scorer": ScoreTopk()})
    capture = IndexerCapture(CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every"))))
    capture.attach(model, pattern="scorer", classes=())
    hidden, keys = torch.randn(1, 3, 8), torch.randn(1, 10, 8)
    holes = torch.ones(1, 3, 10, dtype=torch.bool)
    holes[0, 1, 4] = False  # row 1 attends to [0, 4) and [5, 10)
    expected = ScoreTopk()(hidden, keys, holes)
    with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
        assert torch.equal(model["scorer"](hidden, keys, holes), expected)
        deadline = time.monotonic() + 30
        while not capture.writer.failed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert torch.equal(model["scorer"](hidden, keys, holes), expected)
        summary = capture.close()
    assert not capture.enabled and summary["captured"] == 0
    assert "scorer (width 10)" in summary["error"] and "row 1 attends to a non-contiguous set" in summary["error"]
    assert len([r for r in caplog.records if "capture disabled" in r.getMessage()]) == 1


def test_a_failing_disk_stops_capture_with_one_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model = _tiny("glm_moe_dsa")
    writer = CaptureWriter(tmp_path / "cap.zarr", PolicyState(Policy.parse("every")))

    def full_disk(case: Case, overwrite: bool = False) -> None:
        raise OSError(28, "No space left on device")

    writer.archive.write = full_disk  # type: ignore[method-assign]
    capture = IndexerCapture(writer)
    capture.attach(model)
    ids = torch.randint(0, 128, (1, 12))
    expected = _run(_tiny("glm_moe_dsa"), ids)
    with caplog.at_level(logging.ERROR, logger="logitreplay.capture"):
        assert torch.equal(_run(model, ids), expected)
        deadline = time.monotonic() + 30
        while not writer.failed and time.monotonic() < deadline:  # the writer meets the full disk
            time.sleep(0.01)
        for _ in range(2):
            assert torch.equal(_run(model, ids), expected)
        summary = capture.close()
    assert "No space left on device" in summary["error"] and summary["captured"] == 0
    assert len([r for r in caplog.records if "capture disabled" in r.getMessage()]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_capture_hf_on_cuda(tmp_path: Path, deepseek_dir: Path) -> None:
    out = tmp_path / "cap.zarr"
    summary = _capture([str(deepseek_dir), "--device", "cuda", "--random-tokens", "192", "--chunk-size", "64",
                        "--out", str(out)])
    assert summary["captured"] == 6 and summary["dropped"] == {} and summary["error"] is None
    for case in Archive.open(out):
        assert case.attrs["device"] == torch.cuda.get_device_name() and case.attrs["model_dtype"] == "bfloat16"
        assert case.row_ends.tolist() == [case.cols - 64 + r + 1 for r in range(64)]
        _assert_reference_is_topk(case)


@pytest.mark.slow
def test_the_docs_tiny_model_is_made_and_captured_as_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import re
    import runpy
    import shlex

    text = (Path(__file__).resolve().parents[1] / "docs" / "capture.md").read_text()
    section = text[text.index("### A tiny local model"):text.index("### From Python")]
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    (shell,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny_dsa.py").write_text(code)
    runpy.run_path("tiny_dsa.py", run_name="__main__")
    (capture,) = [shlex.split(line) for line in shell.splitlines() if line.startswith("logitreplay capture")]
    summary = _capture(capture[3:])
    assert summary["captured"] > 0 and summary["error"] is None
    assert all(w > 64 for widths in summary["widths"].values() for w in widths)  # wider than index_topk
