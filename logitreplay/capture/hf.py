"""Capture from a transformers model: load with `from_pretrained`, prefill in chunks, keep the indexer logits.

Prefill runs in chunks through the model's own cache, as a server's chunked prefill does, so each indexer
call sees rows = the chunk's tokens and columns = past + chunk: the shapes production selectors face,
rather than one square matrix. With `generate`, each sequence then continues through the model's own
`generate` (greedy, from the same cache): every step is one query row against the whole context, the
indexer's decode top-k, kept as a decode case (`archive/decode.py`).
"""

from __future__ import annotations

import inspect
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from logitreplay.capture.hooks import IndexerCapture
from logitreplay.capture.policy import Policy, PolicyState
from logitreplay.capture.writer import CaptureWriter
from logitreplay.errors import CaptureError, one_line

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_SNAPSHOT = re.compile(r"[\\/]snapshots[\\/]([0-9a-f]{40})(?:[\\/]|$)")


@dataclass(frozen=True)
class HFRun:
    """What to run: `random_tokens` (one sequence of that many uniform token ids) or `prompts` (each its
    own sequence), every sequence cut to `context_len` tokens when given."""

    model: str
    out: Path
    revision: str | None = None
    prompts: tuple[str, ...] = ()
    random_tokens: int | None = None
    context_len: int | None = None
    chunk_size: int = 2048
    device: str = "cpu"
    dtype: str = "auto"
    attn_implementation: str = "sdpa"
    policy: Policy = Policy()
    seed: int = 0
    generate: int = 0  # decode steps per sequence after its prefill (0: prefill only)


def capture_hf(run: HFRun, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Load the model, prefill every sequence in chunks with capture hooks attached; returns the summary.

    `progress(done_tokens, total_tokens)` is called after each chunk.
    """
    _fail_fast_offline(run.model, run.revision)  # before the slow transformers import
    try:
        import transformers
        from transformers import AutoModelForCausalLM, DynamicCache
    except ImportError as e:
        raise CaptureError(f"capture hf needs transformers (pip install 'logitreplay[hf]'): {e}") from None
    if run.chunk_size < 1:
        raise CaptureError(f"chunk size must be >= 1, got {run.chunk_size}")
    try:
        device = torch.device(run.device)
    except RuntimeError as e:
        raise CaptureError(f"device {run.device!r}: {e}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CaptureError(f"device {run.device!r}: torch sees no CUDA device (torch {torch.__version__})")
    dtype = _DTYPES.get(run.dtype) if run.dtype != "auto" else (torch.bfloat16 if device.type == "cuda"
                                                                 else torch.float32)
    if dtype is None:
        raise CaptureError(f"dtype {run.dtype!r}: expected auto, {', '.join(_DTYPES)}")
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(run.model, revision=run.revision, dtype=dtype,
                                                     attn_implementation=run.attn_implementation)
    except (OSError, ValueError) as e:
        raise CaptureError(f"{run.model}: cannot load ({one_line(e, 300)})") from None
    model.to(device).eval()
    sequences = _sequences(run, model.config.vocab_size)
    if not sequences or all(len(s) == 0 for s in sequences):
        raise CaptureError("nothing to run: every prompt is empty")

    provenance = model_provenance(run.model, run.revision, getattr(model.config, "_commit_hash", None))
    provenance.update({"engine": "transformers", "engine_version": transformers.__version__,
                       "torch_version": torch.__version__, "model_dtype": str(dtype).removeprefix("torch."),
                       "attn_implementation": run.attn_implementation})
    writer = CaptureWriter(run.out, PolicyState(run.policy))
    capture = IndexerCapture(writer, provenance)
    started = time.perf_counter()
    try:
        capture.attach(model)  # also times each forward of the model and counts its indexer calls
        capture.kind = "prefill"  # every forward here is a prefill chunk
        cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        total = sum(len(s) for s in sequences)
        done = generated = 0
        with torch.inference_mode():
            # With generate, a prompt's last token is left to `generate`: its first step runs it against
            # the prefilled cache, so every step it makes is one query row (a decode step).
            for seq_index, start, end, ids in _chunks(sequences, run.chunk_size, hold_last=run.generate > 0):
                if start == 0:
                    cache = DynamicCache(config=model.config)
                if end > start:
                    capture.chunk = {"sequence": seq_index, "token_start": start, "token_end": end}
                    model(input_ids=ids[start:end][None].to(device), use_cache=True, logits_to_keep=1,
                          **{cache_arg: cache})
                    done += end - start
                if run.generate and end == len(ids) - 1:
                    capture.kind, capture.chunk = None, {"sequence": seq_index, "generate": run.generate}
                    model.generate(ids[None].to(device), do_sample=False, max_new_tokens=run.generate,
                                   min_new_tokens=run.generate, **{cache_arg: cache})
                    capture.kind = "prefill"
                    done += 1
                    generated += run.generate
                if progress:
                    progress(done, total)
                if not capture.enabled or capture.selection.exhausted():  # nothing more can be kept
                    break
    finally:
        summary = capture.close()
    summary.update({"model": provenance["model"], "revision": provenance["revision"],
                    "sequences": len(sequences), "tokens": total, "tokens_run": done, "generated": generated,
                    "chunk_size": run.chunk_size, "device": str(device), "seconds": time.perf_counter() - started})
    return summary


def model_provenance(model: str, requested: str | None, commit: str | None) -> dict[str, Any]:
    """Model id (or absolute local path) and the exact revision sha.

    transformers records the commit it loaded from (`config._commit_hash`); when it did not (older
    versions, some offline loads), the sha is read from the hub cache snapshot the files resolve to,
    without touching the network. A local directory has no revision: it is recorded as a path.
    """
    local = Path(model).is_dir()
    sha = commit if commit and re.fullmatch(r"[0-9a-f]{40}", commit) else None
    if sha is None and not local:
        sha = cached_revision(model, requested)
    return {"model": str(Path(model).resolve()) if local else model, "model_source": "local" if local else "hub",
            "revision": sha, "revision_requested": requested}


def _fail_fast_offline(model: str, revision: str | None) -> None:
    """A hub id that is not in the local cache, on a machine that cannot reach the Hub: one line now,
    instead of huggingface_hub's retries with back-off (about half a minute) before the same error.
    Only a direct connection is probed: behind a proxy, or with HF_HUB_OFFLINE set (transformers then
    fails at once by itself), nothing is checked here."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    proxied = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
    a_path = Path(model).is_dir() or os.path.isabs(model) or model.startswith((".", "~"))  # not a hub id
    if a_path or constants.HF_HUB_OFFLINE or proxied or cached_revision(model, revision):
        return
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname or "", url.port or (443 if url.scheme == "https" else 80)),
                                 timeout=5).close()
    except OSError as e:
        raise CaptureError(f"{model}: not a local directory, not in the Hugging Face cache, and "
                           f"{constants.ENDPOINT} cannot be reached ({one_line(e)}); download it where there "
                           "is a network (`hf download MODEL`) or pass a local directory") from None


def cached_revision(repo_id: str, revision: str | None) -> str | None:
    """The commit sha of the hub-cache snapshot holding `repo_id`'s config at `revision`, or None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    except Exception:
        return None
    m = _SNAPSHOT.search(os.fspath(path)) if isinstance(path, str | os.PathLike) else None
    return m.group(1) if m else None


def _chunks(sequences: list[torch.Tensor], size: int, hold_last: bool = False
            ) -> Iterator[tuple[int, int, int, torch.Tensor]]:
    """(sequence index, start, end, sequence) of every prefill chunk, sequence after sequence; with
    `hold_last`, up to each sequence's last token, and one empty chunk for a sequence of one token."""
    for seq_index, ids in enumerate(sequences):
        length = len(ids) - 1 if hold_last else len(ids)
        for start in range(0, max(length, 1 if hold_last else 0), size):
            yield seq_index, start, min(start + size, length), ids


def _sequences(run: HFRun, vocab_size: int) -> list[torch.Tensor]:
    if (run.random_tokens is None) == (not run.prompts):
        raise CaptureError("give exactly one of prompts or random tokens")
    if run.random_tokens is not None:
        g = torch.Generator().manual_seed(run.seed)
        seqs = [torch.randint(0, vocab_size, (run.random_tokens,), generator=g)]
    else:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(run.model, revision=run.revision)
        except (OSError, ValueError) as e:
            raise CaptureError(f"{run.model}: no usable tokenizer for --prompts ({one_line(e)})"
                               ) from None
        seqs = [torch.tensor(tok(p)["input_ids"], dtype=torch.long) for p in run.prompts]
    if run.context_len is not None:
        seqs = [s[:run.context_len] for s in seqs]
    return seqs


__all__ = ["HFRun", "capture_hf", "cached_revision", "model_provenance"]
