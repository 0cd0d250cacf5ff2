"""What capturing costs a model run: capture on a realistic indexer, verify the replay, time the overhead.

A random-initialised DeepSeek-V3.2 with a production-size indexer (64 heads x 128 dims, top-k 2048) is
saved with `save_pretrained` and then:
1. captured through `capture hf` (the same code as the CLI) with every indexer call kept, and the archive
   checked: each case's reference indices (what the module's own top-k picked) select exactly the top-k
   values of its captured rows; then replayed with `logitreplay replay --strict` (every selector verified);
2. timed, as chunked prefill of the same tokens, in alternating rounds of three configurations:
   - plain: no hooks;
   - armed-idle: hooks attached, but the default policy already holds every (layer, width), so each
     indexer call is refused by the pre-hook from its shapes (the steady state of a long capture run);
   - capturing: policy `every`: every indexer call staged and written (a fresh archive per round).
   "extra on stream" = capturing - plain: the time the capture adds to the model's own forward (the
   function mode, bounds and reference indices computed on the device, a device-to-device copy of the
   score matrix; no host sync: the copy to the host, the cut to each row's bounds and the disk write run
   on a side stream and a background thread). The writer's flush after the forward is reported separately.

Run (GPU):  python bench/capture_overhead.py            [--tokens 16384 --chunk-size 4096 --rounds 5]
Smoke (CPU): python bench/capture_overhead.py --device cpu --tokens 256 --chunk-size 64 --index-heads 4 \
                 --index-dim 32 --hidden 64 --layers 2 --top-k 32
Needs: logitreplay with the `hf` extra (transformers >= 5.11). Prints a table last; writes JSON to
$OUT/capture_overhead.json when OUT is set.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.capture import CaptureWriter, HFRun, IndexerCapture, Policy, PolicyState, capture_hf
from logitreplay.cli import main as cli


def build_model(args: argparse.Namespace, path: Path) -> None:
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV32Config(
        vocab_size=32000, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
        moe_intermediate_size=args.hidden // 4, num_hidden_layers=args.layers, num_attention_heads=16,
        num_key_value_heads=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=1,
        topk_group=1, first_k_dense_replace=1, q_lora_rank=max(16, args.hidden // 2),
        kv_lora_rank=max(16, args.hidden // 4), qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
        index_n_heads=args.index_heads, index_head_dim=args.index_dim, index_topk=args.top_k,
        max_position_embeddings=max(4096, args.tokens))
    model: Any = DeepseekV32ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(path)


def check_reference(case: Case, device: torch.device) -> int:
    """Rows whose reference indices do not select exactly the top-k values of the captured row."""
    logits = case.padded(poison=float("-inf"), device=device)
    assert case.reference_indices is not None
    ref = torch.from_numpy(case.reference_indices).to(device).long()
    lengths = torch.from_numpy(case.lengths).to(device)
    k = torch.clamp(lengths, max=case.top_k)
    slot = torch.arange(case.top_k, device=device)[None]
    starts = torch.from_numpy(case.row_starts).to(device).long()[:, None]
    bad = ((slot < k[:, None]) != (ref >= 0)).any(1)
    picked = logits.gather(1, (ref.clamp(min=0) + starts).clamp(max=case.cols - 1))
    picked = torch.where(ref >= 0, picked, float("-inf")).sort(1, descending=True).values
    want = logits.topk(min(case.top_k, case.cols), dim=1).values
    want = torch.where(slot[:, :want.shape[1]] < k[:, None], want, float("-inf"))
    bad |= (picked[:, :want.shape[1]] != want).any(1)
    return int(bad.sum())


def hook_cost_us(model: Any, device: torch.device, work: Path, calls: int = 2000, rounds: int = 5) -> dict[str, float]:
    """What the hooks add to one indexer call the policy refuses (budget spent): a small call of the
    layer-0 indexer timed with an idle capture attached and detached, alternating; microseconds."""
    config = model.config
    indexer = model.model.layers[0].self_attn.indexer
    dtype = next(indexer.parameters()).dtype
    rope = torch.ones(1, 1, config.qk_rope_head_dim, device=device, dtype=dtype)
    args = (torch.randn(1, 1, config.hidden_size, device=device, dtype=dtype),
            torch.randn(1, 1, config.q_lora_rank, device=device, dtype=dtype), (rope, rope * 0),
            torch.ones(1, 1, 1, dtype=torch.bool, device=device), torch.zeros(1, 1, dtype=torch.long, device=device))
    idle = IndexerCapture(CaptureWriter(work / "hook-cost.zarr", PolicyState(Policy.parse("max-cases=0"))))

    def per_call() -> float:
        sync(device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            for _ in range(calls):
                indexer(*args)
        sync(device)
        return (time.perf_counter() - t0) / calls

    per_call()
    plain, armed = [], []
    for _ in range(rounds):
        plain.append(per_call())
        idle.attach(model)
        armed.append(per_call())
        idle.detach()
    idle.close()
    return {"indexer_call_us": 1e6 * statistics.median(plain),
            "hooks_us": 1e6 * statistics.median(a - p for a, p in zip(armed, plain, strict=True))}


def prefill(model: Any, ids: torch.Tensor, chunk: int, device: torch.device) -> float:
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, ids.shape[1], chunk):
            model(input_ids=ids[:, start:start + chunk], cache=cache, use_cache=True, logits_to_keep=1)
    sync(device)
    return time.perf_counter() - t0


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--chunk-size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--index-heads", type=int, default=64)
    ap.add_argument("--index-dim", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=2048)
    ap.add_argument("--work", type=Path, default=None, help="Directory for the model and archives [tmp].")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --device cpu for a smoke run)")
    work = args.work or Path(tempfile.mkdtemp(prefix="capture_overhead-"))
    model_dir = work / "model"
    build_model(args, model_dir)
    dtype = "bfloat16" if device.type == "cuda" else "float32"

    # 1. capture through the CLI's code path, check the cases, replay them with every selector
    cap = work / "cap.zarr"
    t0 = time.perf_counter()
    summary = capture_hf(HFRun(model=str(model_dir), out=cap, random_tokens=args.tokens, chunk_size=args.chunk_size,
                               device=str(device), dtype=dtype, policy=Policy.parse("every")))
    capture_s = time.perf_counter() - t0
    archive = Archive.open(cap)
    bad_rows = sum(check_reference(archive.read(cid), device) for cid in archive.case_ids())
    replay_csv = work / "replay.csv"
    replay_args = ["replay", str(cap), "--device", device.type, "--strict", "--csv", str(replay_csv)]
    replayed = CliRunner().invoke(cli, replay_args)
    print(replayed.output)
    statuses: dict[str, dict[str, int]] = {}
    if replay_csv.exists():
        for line in csv.DictReader(replay_csv.open()):
            per = statuses.setdefault(line["selector"], {})
            per[line["status"]] = per.get(line["status"], 0) + 1

    # 2. alternating timing rounds
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    model = model.to(device).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(1)
                        ).to(device)
    idle = IndexerCapture(CaptureWriter(work / "idle.zarr", PolicyState(Policy())))
    idle.attach(model)
    prefill(model, ids, args.chunk_size, device)  # warmup; fills the default policy: every later call is idle
    idle.detach()
    prefill(model, ids, args.chunk_size, device)
    times: dict[str, list[float]] = {"plain": [], "armed-idle": [], "capturing": []}
    flush: list[float] = []
    staged: list[dict[str, Any]] = []
    for r in range(args.rounds):
        times["plain"].append(prefill(model, ids, args.chunk_size, device))
        idle.attach(model)
        times["armed-idle"].append(prefill(model, ids, args.chunk_size, device))
        idle.detach()
        # A deep queue, so that the timing measures staging rather than drops when the disk is slower
        # than the GPU (drops are still counted and shown).
        capture = IndexerCapture(CaptureWriter(work / f"round{r}.zarr", PolicyState(Policy.parse("every")),
                                               max_pending=256, max_pending_bytes=32 << 30))
        capture.attach(model)
        times["capturing"].append(prefill(model, ids, args.chunk_size, device))
        t0 = time.perf_counter()
        s = capture.close()
        flush.append(time.perf_counter() - t0)
        staged.append({k: s[k] for k in ("captured", "bytes", "dropped", "error")})
        shutil.rmtree(work / f"round{r}.zarr")
    idle_summary = idle.close()
    hooks = hook_cost_us(model, device, work)

    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: (min(v), max(v)) for k, v in times.items()}
    cases = staged[-1]["captured"] or 1
    extra = med["capturing"] - med["plain"]
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "config": vars(args),
        "capture": {"cases": summary["captured"], "bytes": summary["bytes"], "seconds": capture_s,
                    "dropped": summary["dropped"], "error": summary["error"], "reference_mismatched_rows": bad_rows},
        "replay": {"exit_code": replayed.exit_code, "statuses": statuses},
        "seconds": times, "median_s": med,
        "armed_idle_overhead": (med["armed-idle"] - med["plain"]) / med["plain"],
        "capture_extra_on_stream_s": extra,
        "capture_extra_per_case_ms": 1e3 * extra / cases,
        "capture_extra_fraction": extra / med["plain"],
        "staged_per_round": staged, "flush_s": flush, "idle_refused_calls_captured": idle_summary["captured"],
        "hook_cost": hooks,
    }
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"]) / "capture_overhead.json"
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")

    print(f"\ncapture overhead on {result['device']}: {args.tokens} tokens in chunks of {args.chunk_size}, "
          f"{args.layers} layers, indexer {args.index_heads}x{args.index_dim}, top-k {args.top_k}, "
          f"{args.rounds} rounds (median [min, max])")
    print(f"{'configuration':<14}{'prefill ms':>12}{'min':>10}{'max':>10}{'vs plain':>10}")
    for k in times:
        print(f"{k:<14}{1e3 * med[k]:>12.2f}{1e3 * spread[k][0]:>10.2f}{1e3 * spread[k][1]:>10.2f}"
              f"{100 * (med[k] / med['plain'] - 1):>9.2f}%")
    print(f"capturing: {cases} cases/round, {staged[-1]['bytes'] / 2**20:.1f} MiB staged, extra on the model's "
          f"stream {1e3 * extra:.1f} ms ({1e3 * extra / cases:.2f} ms per case), writer flush after the forward "
          f"{statistics.median(flush):.2f} s, dropped {staged[-1]['dropped'] or 'none'}")
    print(f"hooks on a refused indexer call: {hooks['hooks_us']:+.1f} us on a {hooks['indexer_call_us']:.1f} us "
          f"call (x {args.layers} layers x {-(-args.tokens // args.chunk_size)} chunks per prefill)")
    print(f"verification: {bad_rows} rows whose reference is not the top-k; replay --strict exit "
          f"{replayed.exit_code}; statuses {statuses}")


if __name__ == "__main__":
    main()
