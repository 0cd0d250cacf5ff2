"""bench/fidelity.py's report, the arithmetic behind bench/FIDELITY.md's decode verdicts: the best vLLM decode
kernel less its adapter's staging copy, a bf16 case judged against its float32 twin, declined cases shown as
n/a with their reasons once, and a failure never hidden."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "fidelity.py"


@pytest.fixture(scope="module")
def fidelity() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fidelity", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(selector: str, us: float | None = None, status: str = "ok", reason: str | None = None) -> dict[str, Any]:
    return {"selector": selector, "status": status, "reason": reason,
            "timing": None if us is None else {"median_us": us}}


def _case(case_id: str, dtype: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"case_id": case_id, "rows": 8, "top_k": 2048, "dtype": dtype, "kind": "decode", "results": results}


def test_decode_verdicts_use_the_best_vllm_kernel_less_the_copy_and_the_fp32_twin(fidelity: ModuleType,
                                                                                tmp_path: Path) -> None:
    lib = "@$VLLM_LIBS/_C_stable_libtorch.abi3.so"
    fp32 = [_case("batch-b8-k2048", "float32", [
        _result("split", 26.0), _result("native", 60.0), _result("deepselect", 90.0),
        _result("vllm-decode" + lib, 30.0), _result("vllm-persistent" + lib, 25.0),
        _result("vllm-cooperative" + lib, 22.0),
        _result("vllm-auto" + lib, 22.1, reason=f"vLLM 0.33 chose cooperative_topk from {lib[1:]}; staging copy 1 B")]),
        _case("batch-b8-k2048-edges", "float32", [
            _result("split", 21.0), _result("native", 60.0),
            _result("vllm-decode" + lib, 30.0), _result("vllm-persistent" + lib, 27.0),
            _result("vllm-cooperative" + lib, status="unsupported",
                    reason="65 rows: cooperative_topk takes at most 64")])]
    bf16 = [_case("batch-b8-k2048-bf16-edges", "bfloat16", [
        _result("split", 24.0), _result("native", status="failed", reason="check 2"),
        _result("vllm-decode" + lib, status="unsupported", reason="reads float32 logits only, not bfloat16"),
        _result("vllm-auto" + lib, status="unsupported",
                reason="vLLM runs persistent_topk here, which cannot: reads float32 logits only, not bfloat16")])]
    for name, cases in (("decode", fp32), ("decode-bf16", bf16)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"cases": cases, "environment": {"gpu": "GPU X"}}))
    (tmp_path / "copy.json").write_text(json.dumps({"8x2048": 2.0}))
    (tmp_path / "commands.json").write_text(json.dumps({"decode": "logitreplay replay --suite decode"}))
    md = tmp_path / "FIDELITY.md"
    fidelity.report(tmp_path, md)
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in md.read_text().splitlines()
            if line.startswith("| batch")}

    # best = cooperative 22.0 less the 2.0 copy; split 26.0 is 1.30x: a miss, and listed as one.
    assert rows["batch-b8-k2048"][9:11] == ["20.0", "1.30 **miss**"]
    assert rows["batch-b8-k2048"][7] == "22.1 (cooperative_topk)"
    # cooperative declined the 65-row case: n/a there, and the best of the other two (27.0 - 2.0).
    assert rows["batch-b8-k2048-edges"][6] == "n/a" and rows["batch-b8-k2048-edges"][9] == "25.0"
    # The bf16 case has no vLLM time of its own: its float32 twin's best (25.0) is the reference.
    bf = rows["batch-b8-k2048-bf16-edges"]
    assert bf[9:11] == ["25.0", "0.96"] and bf[7] == "n/a (persistent_topk)"
    assert bf[2] == "failed"  # a failure stays visible, not n/a
    text = md.read_text()
    assert "decode/batch-b8-k2048: split 1.30x" in text and "edges: split" not in text
    note = next(line for line in text.splitlines() if line.startswith("*n/a*"))
    assert "cooperative_topk takes at most 64" in note and "65 rows" not in note
    assert "over 3 decode cases: 0.84-1.30, 2 within 1.25x" in text


def test_each_suite_replays_with_its_selectors(fidelity: ModuleType) -> None:
    lib, ds = "/libs/_C_stable_libtorch.abi3.so", "/libs/_deepselect_C.abi3.so"
    prefill = fidelity.selectors("indexer", lib, ds).split(",")
    assert prefill == ["native", "deepselect", f"vllm-native@{lib}", f"vllm-deepselect@{ds}"]
    assert fidelity.selectors("seed-controls", lib, ds) == fidelity.selectors("indexer", lib, ds)
    decode = fidelity.selectors("indexer-decode", lib, ds).split(",")
    assert decode[0] == "split" and "native" in decode
    assert {f"{name}@{lib}" for name in fidelity.VLLM_DECODE} <= set(decode)
    assert fidelity.selectors("decode", lib, ds) == fidelity.selectors("indexer-decode", lib, ds)
    with pytest.raises(ValueError, match="scores"):
        fidelity.selectors("seed-controls-bf16", lib, ds)  # replayed, it would land in no table
    shown = fidelity.as_recorded(["logitreplay", "replay", "--selectors", f"vllm-native@{lib},vllm-deepselect@{ds}"],
                                 lib, ds)
    assert shown == ("logitreplay replay --selectors vllm-native@$VLLM_LIBS/_C_stable_libtorch.abi3.so,"
                     "vllm-deepselect@$VLLM_LIBS/_deepselect_C.abi3.so")


def test_the_indexer_suites_are_scored_one_suite_at_a_time(fidelity: ModuleType, tmp_path: Path) -> None:
    lib = "@$VLLM_LIBS/_C_stable_libtorch.abi3.so"
    prefill = [dict(_case(f"v32-indexer-c{c}-r512-k2048", "float32", [
        _result("native", nat), _result("vllm-native" + lib, up), _result("deepselect", 90.0)]), kind="prefill", rows=512)
        for c, nat, up in ((8192, 50.0, 52.0), (65536, 100.0, 112.0))]
    prefill.append(dict(_case("v32-indexer-c131072-r512-k2048", "float32", [
        _result("native", status="failed", reason="check 2"), _result("vllm-native" + lib, 200.0)]),
        kind="prefill", rows=512))
    decode = [dict(_case("v32-indexer-c163840-b512-n1-k2048-long", "float32", [
        _result("split", 40.0), _result("native", 80.0), _result("vllm-persistent" + lib, 32.0),
        _result("vllm-cooperative" + lib, status="unsupported", reason="512 rows: cooperative_topk takes at most 64")]),
        rows=512)]
    for name, cases in (("indexer", prefill), ("indexer-decode", decode), ("decode", decode)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"cases": cases, "environment": {"gpu": "GPU X"}}))
    (tmp_path / "copy.json").write_text(json.dumps({"512x2048": 2.0}))

    lines, _ = fidelity.tables(tmp_path, ("indexer",))
    text = "\n".join(lines)
    # native / (vLLM - copy): 50 / 50 = 1.000 within; 100 / 110 = 0.909 a miss.
    assert "| indexer | v32-indexer-c8192-r512-k2048 | 50.0 | 52.0 | 2.0 | 1.000 |" in text
    assert "0.909 **miss**" in text and "indexer/v32-indexer-c65536-r512-k2048: 0.909" in text
    assert "over 2 prefill cases: 0.909-1.000, 1 within +-5%." in text
    assert "Decode shapes" not in text and "split" not in text.split("Misses")[0]
    # A case without a ratio is named, not passed over: "every case" stays checkable.
    assert "Not scored (a result of ours or vLLM's missing, failed or untimed): indexer/v32-indexer-c131072" in text

    lines, _ = fidelity.tables(tmp_path, ("indexer-decode",))
    text = "\n".join(lines)
    assert "prefill cases" not in text and "| indexer |" not in text and "Not scored" not in text
    assert "width 163840, sequence lengths mixed 1K-160K, one batch all 32K" in text
    row = next(line for line in lines if line.startswith("| v32-indexer"))
    assert row.split(" | ")[9:11] == ["30.0", "1.33 **miss**"]  # split 40 against persistent 32 - 2
    assert "over 1 decode cases: 1.33-1.33, 0 within 1.25x" in text
    assert "indexer-decode/v32-indexer-c163840-b512-n1-k2048-long: split 1.33x" in text
    assert "decode/v32" not in text.replace("indexer-decode/v32", "")  # decode.json in the folder is not read
