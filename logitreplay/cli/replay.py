"""`logitreplay replay`: replay archives or a built-in suite against selectors, verify, time, report."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import click
import torch
from rich.console import Console

from logitreplay.cli import decisions
from logitreplay.cli.common import STDOUT, check_file_target, json_option, plural, progress, user_errors
from logitreplay.datasets import synth
from logitreplay.errors import ArchiveError, SelectorError
from logitreplay.replay import (
    CaseResult,
    ReplayResult,
    TimingProtocol,
    device_checks,
    environment,
    open_cases,
    replay,
    report,
    write_json,
)
from logitreplay.replay.engine import Unbuildable
from logitreplay.replay.protocol import CPU_ROUNDS, CPU_WARMUP
from logitreplay.replay.results import validate
from logitreplay.selectors import Selector, build, load_factory
from logitreplay.selectors.auto import RULE_ENV, DispatchRule
from logitreplay.selectors.registry import factory_spec, needs_own_process

DEFAULT_SELECTORS = "reference,native,deepselect"


def _wanted(names: str, specs: tuple[str, ...]) -> list[str]:
    return [n.strip() for n in names.split(",") if n.strip()] + list(specs)


def _selectors(names: str, specs: tuple[str, ...]) -> list[Selector]:
    wanted = _wanted(names, specs)
    if not wanted:
        raise SelectorError("no selectors given (--selectors or --selector)")
    out: list[Selector] = []
    for spec in wanted:
        load_factory(factory_spec(spec))  # unknown names and unimportable modules are fatal
        try:
            out.append(build(spec))
        except SelectorError as e:
            out.append(Unbuildable(spec, str(e)))
    seen: set[str] = set()
    for sel in out:
        if sel.name in seen:
            raise SelectorError(f"two selectors are named {sel.name!r}; each column needs its own name")
        seen.add(sel.name)
    return out


def default_device() -> str:
    """CUDA whenever torch sees a device: a replay on a GPU machine times the kernels, not the CPU models."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def _poison(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither a number nor 'nan'") from None
    if math.isinf(value):
        raise click.BadParameter("use a huge finite value (default 1e30) or nan; inf is a legal logit")
    return value


@click.command("replay")
@click.argument("locations", nargs=-1, metavar="[PATH|URL ...]")
@click.option("--suite", type=click.Choice(sorted(synth.SUITES)), default=None,
              help="Built-in control suite to replay (default with no PATH: seed-controls).")
@click.option("--scale", type=click.Choice(synth.SCALES), default=None,
              help="Suite scale [default: small on CPU, full on CUDA].")
@click.option("--selectors", "names", default=DEFAULT_SELECTORS, show_default=True,
              help="Comma-separated registered selector names (built-ins, upstream adapters, plugins).")
@click.option("--selector", "specs", multiple=True, metavar="MODULE:FACTORY",
              help="An extra selector from a factory, e.g. mypkg.topk:make (repeatable).")
@click.option("--baseline", default=None, help="Selector the ratio columns divide by [default: native if "
              "selected, else the first].")
@click.option("--case", "case_globs", multiple=True, metavar="ID|GLOB",
              help="Only the cases whose id matches, e.g. 'b-normal*' (repeatable; any may match).")
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
@click.option("--poison", "poison_text", default="1e30", show_default=True, metavar="FLOAT|nan",
              help="Value of the cells outside each row's bounds.")
@json_option("Every sample, the protocol and the environment (with `--json` alone the table goes to stderr)")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write one line per case and selector.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write a PNG bar plot (needs matplotlib: pip install 'logitreplay[plot]').")
@click.option("--wide", is_flag=True, help="The full table (whole case ids, source, DS fast path reasons, "
              "unabbreviated names) instead of the one that fits 80 columns.")
@click.option("--recommend", is_flag=True, help="Print, per selector pair, the logits width where one overtakes "
              "the other (a dispatch rule from the measured cases), and add it to the JSON.")
@click.option("--isolate", is_flag=True, help="Run each selector in a child process of its own: a selector that "
              "hangs, crashes or breaks the CUDA context loses only its own result for that case.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds one selector may spend on one case (verify + time) before its child is killed; "
              "implies --isolate [default with --isolate: 600].")
@click.option("--controls", callback=decisions.controls_option, default=None, metavar="matched,ablate,shuffle",
              help="Follow every case with derived controls of the same shape: matched (normal random values), "
              "ablate (its values + 100 and * 1e-8), shuffle (its values permuted within each row); the table "
              "shows real / matched per selector.")
@click.option("--per-forward", is_flag=True, help="From the capture's call records, each selector's top-k time "
              "per forward pass and its share of the forward, and the calls no replayed case covers.")
@click.option("--rule-out", type=click.Path(path_type=Path, dir_okay=False), default=None, metavar="RULE.json",
              help="Write the measured dispatch rule (per dtype and kind: width intervals -> selector) for "
              "--selectors auto.")
@click.option("--rule", "rule_path", type=click.Path(path_type=Path, dir_okay=False, exists=True), default=None,
              metavar="RULE.json", help="The dispatch rule the 'auto' selector follows (from --rule-out).")
@click.option("--strict", is_flag=True, help="Exit 1 when a selector failed verification or raised, or a "
              "case was invalid (without it such a run ends with a RESULTS FAILED line and exit 0).")
@user_errors
def replay_cmd(locations: tuple[str, ...], suite: str | None, scale: str | None, names: str,
               specs: tuple[str, ...], baseline: str | None, case_globs: tuple[str, ...],
               case_regex: str | None, device: str | None, warmup: int | None, rounds: int | None,
               timer: str | None, l2: str | None, poison_text: str, json_out: str | None,
               csv_path: Path | None, plot_path: Path | None, wide: bool, recommend: bool, isolate: bool,
               timeout_s: float | None, controls: tuple[str, ...], per_forward: bool, rule_out: Path | None,
               rule_path: Path | None, strict: bool) -> None:
    """Replay captured cases (archives: directories, .zip, URLs such as hf://datasets/...) or a built-in
    control suite against top-k selectors: verify every selector's output, time the verified ones, and
    print a table of median times and ratios to a baseline."""
    poison = _poison(poison_text)
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib: pip install 'logitreplay[plot]'")
    for path, option in ((csv_path, "--csv"), (plot_path, "--plot")):
        if path is not None:
            check_file_target(path, option)  # before the run, not after it
    device = device or default_device()
    if device == "cuda" and not torch.cuda.is_available():
        raise click.ClickException("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is "
                                   f"False; torch {torch.__version__})")
    dev = torch.device(device)
    if not locations and suite is None:
        suite = "seed-controls"
    scale = scale or ("full" if dev.type == "cuda" else "small")
    if rule_path is not None:
        os.environ[RULE_ENV] = str(rule_path.resolve())  # the auto factory reads it, in isolated children too
    elif "auto" in _wanted(names, specs) and not os.environ.get(RULE_ENV):
        raise click.BadParameter("the auto selector needs --rule RULE.json (from --rule-out)", param_hint="--rule")
    if rule_out is not None:
        check_file_target(rule_out, "--rule-out")
    selectors = _selectors(names, specs)
    columns = [s.name for s in selectors]
    if baseline is not None and baseline not in columns:
        raise click.BadParameter(f"{baseline!r} is not one of the selectors ({', '.join(columns)})",
                                 param_hint="--baseline")
    baseline = baseline or ("native" if "native" in columns else columns[0])
    notes: list[str] = []
    protocol = TimingProtocol.for_device(dev.type, warmup, rounds, l2 or "cold", timer or "events")  # type: ignore[arg-type]
    if dev.type == "cpu":
        label = "wall clock of the CPU algorithm models, not kernel times"
        warm = "the verification call" + (f" and {protocol.warmup} more" if protocol.warmup else "")
        notes.append(f"CPU warmup: {warm}; CUDA: {TimingProtocol.warmup} warmups, "
                     f"{TimingProtocol.rounds} rounds x {TimingProtocol.samples_per_round}")
        notes += [f"{option} {value} is ignored on CPU (wall clock, no L2 flush)"
                  for option, value in (("--timer", timer), ("--l2", l2)) if value is not None]
    else:
        label = f"CUDA kernel time, {'CUPTI' if timer == 'cupti' else 'CUDA events'}, L2 {l2 or 'cold'}, graph replay"
    # The measured read bandwidth (bytes/s) for the floor, on CUDA.
    read_bandwidth: float | None = None
    cases, total, pinned = open_cases(list(locations), suite, scale, controls=controls, case_globs=case_globs,
                                      case_regex=case_regex)
    if total == 0:
        raise ArchiveError("nothing to replay: the archives hold no complete case")
    if len(pinned) < len(locations):
        notes.append(f"{plural(len(locations) - len(pinned), 'archive')} named more than once: each archive "
                     "is replayed once")
    env = environment(dev)
    env["inputs"] = pinned + ([f"suite {suite} ({scale})"] if suite else [])
    extra_checks = device_checks(dev)
    if dev.type == "cuda":
        from logitreplay.replay import measure_read_bandwidth

        read_bandwidth = measure_read_bandwidth(dev)
        env["read_bandwidth_bytes_per_s"] = read_bandwidth
    result = ReplayResult(str(dev), label, protocol, env, baseline, columns, notes=notes)
    # Two builds of one kernel library (installed and a path, or two paths) cannot share a process.
    own_process = needs_own_process(_wanted(names, specs))
    from logitreplay.replay.cuda_errors import DeviceLost
    from logitreplay.replay.isolate import Job, merge, replay_isolated
    from logitreplay.replay.resume import finish_run

    # The jobs of isolated children: for --isolate, and for the rest of a run whose CUDA context was lost.
    jobs = [Job(spec, sel.name, pinned, suite, scale, device, protocol.to_json(), poison, read_bandwidth,
                case_globs=case_globs, case_regex=case_regex, controls=controls)
            for spec, sel in zip(_wanted(names, specs), selectors, strict=True)]
    if isolate or timeout_s is not None or own_process:
        del cases  # each child opens the cases itself
        per_selector: dict[str, dict[int, CaseResult]] = {}
        isolated = replay_isolated(jobs, total, 600.0 if timeout_s is None else timeout_s)
        for name, index, case_result in progress(isolated, total * len(jobs), "replay (isolated)"):
            per_selector.setdefault(name, {})[index] = case_result
        result.cases = merge(per_selector, columns, total)
        if own_process and not isolate:
            notes.append("kernel libraries from different builds: each selector ran in its own process")
        notes.append("--isolate: each selector ran in its own process; timing rounds alternate only within "
                     "a selector")
    else:
        stream = replay(cases, selectors, dev, protocol, poison, extra_checks, read_bandwidth)
        try:
            for case_result in progress(stream, total, "replay"):
                result.cases.append(case_result)
        except DeviceLost as lost:  # a sticky CUDA error: the rest runs in fresh processes
            at = len(result.cases)
            result.cases = finish_run(result.cases, lost, jobs, columns, total, 600.0, progress)
            notes.append(f"{lost} on case {result.cases[at].case_id}; the rest of the run continued in fresh "
                         "processes, one per selector")
    # Off a terminal (logs, pipes, CI) rich would wrap the table at 80 columns; give it room instead.
    # With the JSON on stdout, everything for people goes to stderr.
    to_stderr = json_out == STDOUT
    console = Console(stderr=to_stderr)
    if not console.is_terminal:
        console = Console(stderr=to_stderr, width=220)
    if dev.type == "cuda":
        from logitreplay.replay import sm_clock_mhz

        result.environment["sm_clock_mhz_end"] = sm_clock_mhz(dev)
    report.print_report(result, console, wide)
    if recommend:
        from logitreplay.replay.recommend import recommend as dispatch_rules

        rules = dispatch_rules(result)
        result.recommendation = [r.to_json() for r in rules]
        console.print("dispatch rule (measured; the bounding cases are in the JSON):" if rules else
                      "dispatch rule: no two selectors were timed on a common width")
        for rule in rules:
            console.print(f"  {rule.rule}", markup=False)
    decisions.print_controls(result, console)
    if rule_path is not None and "auto" in columns:
        decisions.annotate_auto(result, DispatchRule.load(rule_path), console)
    if per_forward:
        from logitreplay.archive import Archive
        from logitreplay.replay.per_forward import per_forward as forward_totals

        totals = forward_totals(result, [Archive.open(loc) for loc in pinned])
        result.per_forward = [t.to_json() for t in totals]
        decisions.print_per_forward(totals, suite, console)
    if rule_out is not None:
        from logitreplay.replay.recommend import fit_rule

        fitted = fit_rule(result)
        fitted.save(rule_out)
        console.print(f"dispatch rule over {', '.join(fitted.selectors)} written to {rule_out}:", markup=False)
        decisions.print_rule(fitted, console)
    if json_out == STDOUT:
        data = result.to_json()
        validate(data)
        click.echo(json.dumps(data, indent=1, allow_nan=False))
    elif json_out is not None:
        write_json(result, Path(json_out))
    if csv_path is not None:
        report.write_csv(result, csv_path)
    if plot_path is not None:
        report.write_plot(result, plot_path)
    bad = report.problems(result)
    if bad:
        unusable = [b for b in bad if b.endswith(("(invalid)", "(incomplete)"))]  # every one is listed
        results = [b for b in bad if b not in unusable]
        listed = ", ".join(results[:5] + (["..."] if len(results) > 5 else []) + unusable)
        if strict:
            raise click.ClickException(f"--strict: {len(bad)} failed, errored or invalid: {listed}")
        console.print(f"[bold red]RESULTS FAILED[/bold red] ({total} cases x {len(columns)} selectors): {len(bad)} "
                      f"failed verification, raised, or were invalid: {listed} (exit status 0; --strict exits 1)",
                      highlight=False)
