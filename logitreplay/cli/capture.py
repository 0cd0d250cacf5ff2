"""`logitreplay capture ...`: capture indexer logits from a real model run into an archive."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from logitreplay.capture.policy import Policy
from logitreplay.cli.common import check_dir_target, emit_json, json_option, user_errors
from logitreplay.errors import CaptureError, one_line


@click.group("capture")
def capture_group() -> None:
    """Capture indexer logits from real model runs (transformers here; vLLM through its plugin)."""


@capture_group.command("hf")
@click.argument("model")
@click.option("--revision", help="Branch, tag or commit of a hub model (the exact sha is recorded).")
@click.option("--prompts", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="UTF-8 text file; each non-empty line is one prompt (run as its own sequence).")
@click.option("--random-tokens", type=click.IntRange(min=1), help="Run one sequence of N uniform random tokens.")
@click.option("--context-len", type=click.IntRange(min=1), help="Cut every sequence to N tokens.")
@click.option("--chunk-size", type=click.IntRange(min=1), default=2048, show_default=True,
              help="Prefill chunk: each indexer call sees rows = chunk, cols = past + chunk.")
@click.option("--device", default="cpu", show_default=True, help="torch device, e.g. cpu, cuda, cuda:1.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default="auto",
              show_default=True, help="Model weights dtype (auto: bfloat16 on CUDA, float32 on CPU).")
@click.option("--attn-implementation", type=click.Choice(["sdpa", "eager"]), default="sdpa", show_default=True)
@click.option("--policy", "policy_items", multiple=True, metavar="SPEC",
              help="Capture policy items, repeatable or comma-separated: every, single-request, layers=0-3+7, "
                   "min-width=N, max-width=N, max-cases=N, max-bytes=2G. Default: first matrix per "
                   "(layer, width); decode steps per (layer, batch and width power-of-two buckets).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --random-tokens.")
@click.option("--generate", type=click.IntRange(min=0), default=0, show_default=True,
              help="After each sequence's prefill, generate N tokens (greedy, the model's own generate): "
                   "its steps are captured as decode cases (one query row against the whole context).")
@click.option("--out", required=True, type=click.Path(file_okay=True, path_type=Path),
              help="Archive directory (created, or appended to).")
@json_option("The summary")
@user_errors
def hf_cmd(model: str, revision: str | None, prompts: Path | None, random_tokens: int | None,
           context_len: int | None, chunk_size: int, device: str, dtype: str, attn_implementation: str,
           policy_items: tuple[str, ...], seed: int, generate: int, out: Path, json_out: str | None) -> None:
    """Load MODEL (hub id or local directory) with transformers, prefill in chunks, capture its indexers."""
    from logitreplay.capture.hf import HFRun, capture_hf

    if (prompts is None) == (random_tokens is None):
        raise click.UsageError("give exactly one of --prompts FILE or --random-tokens N")
    check_dir_target(out, "--out")
    try:
        policy = Policy.parse(",".join(policy_items))
        lines = () if prompts is None else tuple(
            line for line in prompts.read_text(encoding="utf-8").splitlines() if line.strip())
        if prompts is not None and not lines:
            raise CaptureError(f"{prompts}: no prompts (every line is empty)")
        run = HFRun(model=model, out=out, revision=revision, prompts=lines, random_tokens=random_tokens,
                    context_len=context_len, chunk_size=chunk_size, device=device, dtype=dtype,
                    attn_implementation=attn_implementation, policy=policy, seed=seed, generate=generate)
        summary = _with_progress(run, capture_hf, quiet=json_out is not None)
    except UnicodeDecodeError as e:  # a prompts file that is not UTF-8
        raise click.ClickException(f"{prompts}: {one_line(e, None)}") from None
    if json_out is not None:
        emit_json(summary, json_out, indent=2)
    else:
        _print_summary(summary)
    if summary.get("error"):
        raise click.ClickException(f"capture stopped early: {summary['error']}")


def _with_progress(run: Any, fn: Callable[..., dict[str, Any]], quiet: bool) -> dict[str, Any]:
    if quiet or not sys.stderr.isatty():
        return fn(run)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("prefill", total=None)
        return fn(run, lambda done, total: bar.update(task, completed=done, total=total))


def _print_summary(s: dict[str, Any]) -> None:
    """The capture's summary within 80 columns: what was kept per layer, then the run."""
    from rich.console import Console

    from logitreplay.replay.report import Column, print_lines, render, wrap

    tokens = f"{s['tokens']} tokens" if s["tokens_run"] == s["tokens"] else \
        f"{s['tokens_run']} of {s['tokens']} tokens (stopped: nothing more to keep)"
    if s.get("generated"):
        tokens += f", {s['generated']} generated"
    lines = wrap(f"captured {s['captured']} cases ({s['bytes'] / 2**20:.1f} MiB of logits) -> {s['archive']}")
    lines += render([Column("layer", fold=True), Column("widths (columns)", fold=True)],
                    [[name, ", ".join(map(str, widths))] for name, widths in s["widths"].items()])
    lines += wrap(f"model {s['model']} @ {s['revision'] or '(local, no revision)'}: {s['sequences']} sequence(s), "
                  f"{tokens}, chunk {s['chunk_size']}, {s['device']}, {s['seconds']:.1f} s")
    for kind in ("dropped", "skipped"):
        if s[kind]:
            lines += wrap(f"{kind}: " + ", ".join(f"{k}={v}" for k, v in s[kind].items()))
    print_lines(Console(), lines)


__all__ = ["capture_group"]
