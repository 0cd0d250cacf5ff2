"""`logitreplay replay`: replay archives or a built-in suite against selectors, verify, time, report.

The options become a `ReplayConfig` and the replay is `run_replay`'s (replay/run.py); this module parses
and prints."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
from pathlib import Path
from typing import NoReturn

import click
from rich.console import Console

from logitreplay.cli import decisions
from logitreplay.cli.common import STDOUT, check_json_target, json_option, progress, user_errors
from logitreplay.cli.names import complete_case_ids, complete_selectors
from logitreplay.cli.report import check_outputs, console_for, read_report, verdict, write_files
from logitreplay.datasets import synth
from logitreplay.replay import ReplayConfig, ReplayResult, TimingProtocol, report, run_replay, write_json
from logitreplay.replay.distributed import in_rank, start, supervising
from logitreplay.replay.distributed import replay as replay_rank
from logitreplay.replay.protocol import CPU_ROUNDS, CPU_WARMUP
from logitreplay.replay.results import validate
from logitreplay.replay.resume import resume_replay
from logitreplay.replay.run import DEFAULT_SELECTORS, ReplayInterrupted, default_device, resolve
from logitreplay.selectors.auto import RULE_ENV, DispatchRule

__all__ = ["default_device", "replay_cmd"]


def _wanted(names: str, specs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(n.strip() for n in names.split(",") if n.strip()) + specs


def _poison(ctx: click.Context, param: click.Parameter, text: str) -> float:
    """click callback of --poison: a finite number or nan, else a usage error naming the option."""
    try:
        value = float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a number nor 'nan'", ctx, param) from None
    if math.isinf(value):
        raise click.BadParameter("use a huge finite value (default 1e30) or nan; inf is a legal logit", ctx, param)
    return value


def _check_outputs(csv_path: Path | None, plot_path: Path | None, rule_out: Path | None,
                   rule_path: Path | None) -> None:
    """Refuse, before the run, outputs that cannot be written (not after it) and a --rule that is not one."""
    check_outputs(csv_path, plot_path)
    if rule_out is not None:
        check_json_target(rule_out, "--rule-out")
    if rule_path is not None:
        DispatchRule.load(rule_path)


def _warn_full_scale_on_cpu(config: ReplayConfig) -> None:
    """Say up front that a full-scale suite on the CPU models takes long, and about how long relative to
    --scale small (their work grows with the logits they read)."""
    config = resolve(config)
    if config.suite is None or config.scale != "full" or not str(config.device).startswith("cpu"):
        return
    cells = {scale: sum(r.rows * r.cols for r in synth.recipes(config.suite, scale)) for scale in ("small", "full")}
    text = (f"note: --scale full on a CPU runs the CPU models over the published shapes, "
            f"{cells['full'] / max(cells['small'], 1):.0f}x the logits of --scale small: expect about as many "
            "times its run time (progress follows on stderr)")
    click.echo("\n".join(report.wrap(text)), err=True)


def _decide(result: ReplayResult, inputs: list[str], suite: str | None, recommend: bool, per_forward: bool,
            rule_path: Path | None, rule_out: Path | None, console: Console) -> None:
    """The decisions drawn from the timings: --recommend, --controls, the auto selector's choices,
    --per-forward, --rule-out (each adds its part to the report)."""
    if recommend:
        from logitreplay.replay.recommend import recommend as dispatch_rules

        rules = dispatch_rules(result)
        result.recommendation = [r.to_json() for r in rules]
        decisions.print_recommend(rules, console)
    decisions.print_controls(result, console)
    if rule_path is not None and "auto" in result.selectors:
        decisions.annotate_auto(result, DispatchRule.load(rule_path), console)
    if per_forward:
        from logitreplay.archive import Archive
        from logitreplay.replay.per_forward import per_forward as forward_totals

        totals = forward_totals(result, [Archive.open(loc) for loc in inputs])
        result.per_forward = [t.to_json() for t in totals]
        decisions.print_per_forward(totals, suite, console, result.device)
    if rule_out is not None:
        from logitreplay.replay.recommend import fit_rule

        fitted = fit_rule(result)
        fitted.save(rule_out)
        report.print_lines(console, report.wrap(f"dispatch rule over {', '.join(fitted.selectors)} written to "
                                                f"{rule_out}:"))
        decisions.print_rule(fitted, console)


def _write(result: ReplayResult, json_out: str | None, csv_path: Path | None, plot_path: Path | None) -> None:
    unchecked = None  # a schema check that could not run says so; the report is written all the same
    if json_out == STDOUT:
        data = result.to_json()
        unchecked = validate(data)
        click.echo(json.dumps(data, indent=1, allow_nan=False))
    elif json_out is not None:
        unchecked = write_json(result, Path(json_out))
    if unchecked is not None:
        click.echo(f"note: {unchecked}", err=True)
    write_files(result, csv_path, plot_path, err=json_out == STDOUT)


# The options --resume takes from the report's recorded configuration (the outputs it may be given anew).
_RUN_OPTIONS = ("locations", "suite", "scale", "names", "specs", "baseline", "case_globs", "case_regex", "device",
                "warmup", "rounds", "timer", "l2", "poison", "recommend", "isolate", "timeout_s", "controls",
                "per_forward", "rule_out", "rule_path", "devices", "tolerate_recall", "determinism")


def _interrupted(stop: ReplayInterrupted, json_out: str | None, csv_path: Path | None, plot_path: Path | None,
                 wide: bool) -> NoReturn:
    """Print and write what an interrupted run finished, marked partial, and exit as the signal asks
    (130 for SIGINT, 143 for SIGTERM)."""
    logging.getLogger("asyncio").disabled = True  # zarr's pending I/O tasks would each log at exit
    result = stop.run.result
    if not result.cases:
        click.echo(f"interrupted ({stop.signal}) before any case had finished: no report written", err=True)
        raise click.exceptions.Exit(128 + signal.Signals[stop.signal].value)
    if result.partial is not None:
        result.partial["outputs"] = {k: str(v) for k, v in (("json", json_out), ("csv", csv_path),
                                                            ("plot", plot_path)) if v is not None and v != STDOUT}
    report.print_report(result, console_for(stderr=json_out == STDOUT), wide)
    _write(result, json_out, csv_path, plot_path)
    raise click.exceptions.Exit(128 + signal.Signals[stop.signal].value)


def _resume(path: Path, json_out: str | None, csv_path: Path | None, plot_path: Path | None, wide: bool,
            strict: bool) -> None:
    """`replay --resume R.json`: the run R.json records, finished (resume.py), written where it was."""
    ctx = click.get_current_context()
    given = [p.opts[0] if p.opts else p.name for p in ctx.command.params
             if p.name in _RUN_OPTIONS and ctx.get_parameter_source(p.name or "") != click.core.ParameterSource.DEFAULT]
    if given:
        raise click.BadParameter(f"--resume replays with the options {path} records; {', '.join(given)} cannot "
                                 "change them (only --json, --csv, --plot, --wide, --strict)", param_hint="--resume")
    previous = read_report(path)
    outputs = (previous.partial or {}).get("outputs") or {}
    json_out = json_out or outputs.get("json") or str(path)
    csv_path = csv_path or (Path(outputs["csv"]) if outputs.get("csv") else None)
    plot_path = plot_path or (Path(outputs["plot"]) if outputs.get("plot") else None)
    if json_out != STDOUT:
        check_json_target(Path(json_out), "--json")
    check_outputs(csv_path, plot_path)
    try:
        run = resume_replay(previous, progress, name=str(path))
    except ReplayInterrupted as stop:
        _interrupted(stop, json_out, csv_path, plot_path, wide)
    console = console_for(stderr=json_out == STDOUT)
    report.print_report(run.result, console, wide)
    decisions.print_controls(run.result, console)
    _write(run.result, json_out, csv_path, plot_path)
    verdict(run.result, strict, console)


@click.command("replay")
@click.argument("locations", nargs=-1, metavar="[PATH|URL ...]")
@click.option("--suite", type=click.Choice(sorted(synth.SUITES)), default=None, metavar="NAME",
              help=f"Built-in control suite to replay: {', '.join(sorted(synth.SUITES))} (default with no PATH: "
              "seed-controls).")
@click.option("--scale", type=click.Choice(synth.SCALES), default=None,
              help="Suite scale [default: small on CPU, full on CUDA].")
@click.option("--selectors", "names", default=",".join(DEFAULT_SELECTORS), show_default=True,
              shell_complete=complete_selectors,
              help="Comma-separated registered selector names (built-ins, upstream adapters, plugins).")
@click.option("--selector", "specs", multiple=True, metavar="MODULE:FACTORY", shell_complete=complete_selectors,
              help="An extra selector from a factory, e.g. mypkg.topk:make (repeatable).")
@click.option("--baseline", default=None, shell_complete=complete_selectors, help="Selector the ratio columns divide by [default: native if "
              "selected, else the first].")
@click.option("--case", "case_globs", multiple=True, metavar="ID|GLOB", shell_complete=complete_case_ids,
              help="Only the cases whose id, or its short form in the table, matches, e.g. 'b-normal*' "
              "(repeatable; any may match; `logitreplay cases` lists the ids).")
@click.option("--match", "case_regex", default=None, metavar="REGEX",
              help="Only the cases whose id contains a match of this regular expression.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="[default: cuda when torch sees a CUDA device, else cpu]")
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help=f"Warmup calls per selector [default: {TimingProtocol.warmup} on CUDA, {CPU_WARMUP} on CPU].")
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help=f"Alternating timing rounds [default: {TimingProtocol.rounds} on CUDA, {CPU_ROUNDS} on CPU].")
@click.option("--timer", type=click.Choice(["events", "cupti"]), default=None,
              help="CUDA only: CUDA events around graph replays, or kernel durations from the profiler "
              "[default: events].")
@click.option("--l2", type=click.Choice(["cold", "warm"]), default=None,
              help="CUDA only: flush L2 before every timed call (cold) or not [default: cold].")
@click.option("--poison", "poison", default="1e30", show_default=True, metavar="FLOAT|nan", callback=_poison,
              help="Value of the cells outside each row's bounds.")
@json_option("Every sample, the protocol and the environment (with `--json` alone the table goes to stderr)")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write one line per case and selector.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write a bar plot; its extension names the format (.png, .pdf, .svg, ...; needs matplotlib: "
              "pip install 'logitreplay[plot]').")
@click.option("--wide", is_flag=True, help="The full table (whole case ids, source, DS fast path reasons, "
              "unabbreviated names) instead of the one that fits 80 columns.")
@click.option("--recommend", is_flag=True, help="Print, per selector pair, the logits width where one overtakes "
              "the other (a dispatch rule from the measured cases), and add it to the JSON.")
@click.option("--isolate", is_flag=True, help="Run each selector in a child process of its own: a selector that "
              "hangs, crashes or breaks the CUDA context loses only its own result for that case.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds one selector may spend on one case (verify + time) before its child is killed; "
              "implies --isolate [default with --isolate: 600].")
@click.option("--controls", callback=decisions.controls_option, default=None, metavar="KIND,...",
              help="Follow every case with derived controls of the same shape, any of: matched (normal random "
              "values), ablate (its values + 100 and * 1e-8), shuffle (its values permuted within each row), "
              "indexer (scores made as DeepSeek V3.2's indexer makes them); the table shows real / matched "
              "per selector.")
@click.option("--per-forward", is_flag=True, help="From the capture's call records, each selector's top-k time "
              "per forward pass and its share of the forward, and the calls no replayed case covers.")
@click.option("--rule-out", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="RULE.json",
              help="Write the measured dispatch rule (per dtype and kind: width intervals -> selector) for "
              "--selectors auto.")
@click.option("--rule", "rule_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              metavar="RULE.json", help="The dispatch rule the 'auto' selector follows (from --rule-out).")
@click.option("--strict", is_flag=True, help="Exit 1 when a selector failed verification or raised, or a "
              "case was invalid (without it such a run ends with a RESULTS FAILED line and exit 0).")
@click.option("--resume", "resume_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              metavar="R.json", help="Finish the interrupted (SIGINT, SIGTERM) run whose partial JSON report this "
              "is: replay the cases it lacks with its recorded options, and write the whole report (to R.json, "
              "and its CSV and plot, unless --json, --csv, --plot say otherwise).")
@click.option("--devices", default=None, metavar="0,1,...", help="One rank per listed GPU of this machine (with "
              "--device cpu, one CPU rank per entry), each replaying a cost-balanced share of the cases; one "
              "report, with a ranks section (torchrun -m logitreplay replay across machines: docs/distributed.md).")
@click.option("--tolerate-recall", "tolerate_recall", type=click.FloatRange(0, 1), default=None, metavar="R",
              help="An approximate selector passes check 3 when every row holds at least this fraction R of the "
              "exact top-k's values; it is timed and reported as approximate, never as exact.")
@click.option("--determinism", type=click.IntRange(min=0), default=0, metavar="N",
              help="Rerun every verified selector N more times on each case, as it is timed (on CUDA: graph "
              "replays, and launches on a second stream under a concurrent copy), and report whether its index "
              "sets and their order were identical every time.")
@user_errors
def replay_cmd(locations: tuple[str, ...], suite: str | None, scale: str | None, names: str,
               specs: tuple[str, ...], baseline: str | None, case_globs: tuple[str, ...],
               case_regex: str | None, device: str | None, warmup: int | None, rounds: int | None,
               timer: str | None, l2: str | None, poison: float, json_out: str | None,
               csv_path: Path | None, plot_path: Path | None, wide: bool, recommend: bool, isolate: bool,
               timeout_s: float | None, controls: tuple[str, ...], per_forward: bool, rule_out: Path | None,
               rule_path: Path | None, strict: bool, resume_path: Path | None, devices: str | None,
               tolerate_recall: float | None, determinism: int) -> None:
    """Replay captured cases (archives: directories, .zip, URLs such as hf://datasets/...) or a built-in
    control suite against top-k selectors: verify every selector's output, time the verified ones, and
    print a table of median times and ratios to a baseline. Stopped by Ctrl-C (SIGINT) or SIGTERM, it
    writes the table, JSON and CSV of the cases it finished, marked partial; --resume finishes it."""
    if resume_path is not None:
        _resume(resume_path, json_out, csv_path, plot_path, wide, strict)
        return
    _check_outputs(csv_path, plot_path, rule_out, rule_path)
    selectors = _wanted(names, specs)
    if rule_path is None and "auto" in selectors and not os.environ.get(RULE_ENV):
        raise click.BadParameter("the auto selector needs --rule RULE.json (from --rule-out)", param_hint="--rule")
    if rule_path is not None and "auto" not in selectors:
        raise click.BadParameter("only the auto selector follows a rule: add auto to --selectors (e.g. auto,native)",
                                 param_hint="--rule")
    config = ReplayConfig(locations, suite, scale, selectors, baseline, case_globs, case_regex, controls,
                          device=device, warmup=warmup, rounds=rounds, timer=timer, l2=l2,  # type: ignore[arg-type]
                          poison=poison, isolate=isolate, timeout_s=timeout_s, rule_path=rule_path,
                          tolerate_recall=tolerate_recall, determinism=determinism)
    _warn_full_scale_on_cpu(config)
    if devices is not None or supervising():
        raise SystemExit(start(devices, config, sys.argv[1:]))
    try:
        run = replay_rank(config, progress) if in_rank() else run_replay(config, progress)
    except ReplayInterrupted as stop:
        _interrupted(stop, json_out, csv_path, plot_path, wide)
    if run is None:  # a rank other than 0: rank 0 writes the report
        return
    result = run.result
    console = console_for(stderr=json_out == STDOUT)
    report.print_report(result, console, wide)
    _decide(result, run.inputs, run.config.suite, recommend, per_forward, rule_path, rule_out, console)
    _write(result, json_out, csv_path, plot_path)
    verdict(result, strict, console)
