"""`logitreplay replay`: replay archives or a built-in suite against selectors, verify, time, report."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import click
import torch
from rich.console import Console

from logitreplay.archive import Case
from logitreplay.cli.common import progress, user_errors
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
from logitreplay.replay.protocol import CPU_ROUNDS, CPU_WARMUP
from logitreplay.selectors import Launch, Selector, available, build, load_factory

DEFAULT_SELECTORS = "reference,native,deepselect"


class Unbuildable:
    """Stands in for a selector whose factory raised: every case reports that error, others still run."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def supports(self, case: Case, device: torch.device) -> str | None:
        raise RuntimeError(self.reason)

    def prepare(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int, out: torch.Tensor) -> Launch:
        raise RuntimeError(self.reason)


def _wanted(names: str, specs: tuple[str, ...]) -> list[str]:
    return [n.strip() for n in names.split(",") if n.strip()] + list(specs)


def _selectors(names: str, specs: tuple[str, ...]) -> list[Selector]:
    wanted = _wanted(names, specs)
    if not wanted:
        raise SelectorError("no selectors given (--selectors or --selector)")
    registry = available()
    out: list[Selector] = []
    for spec in wanted:
        load_factory(registry.get(spec, spec))  # unknown names and unimportable modules are fatal
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
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--warmup", type=click.IntRange(min=0), default=None,
              help=f"Warmup calls per selector [default: {TimingProtocol.warmup} on CUDA, {CPU_WARMUP} on CPU].")
@click.option("--rounds", type=click.IntRange(min=1), default=None,
              help=f"Alternating timing rounds [default: {TimingProtocol.rounds} on CUDA, {CPU_ROUNDS} on CPU].")
@click.option("--timer", type=click.Choice(["events", "cupti"]), default="events", show_default=True,
              help="CUDA only: CUDA events around graph replays, or kernel durations from the profiler.")
@click.option("--l2", type=click.Choice(["cold", "warm"]), default="cold", show_default=True,
              help="CUDA only: flush L2 before every timed call (cold) or not.")
@click.option("--poison", "poison_text", default="1e30", show_default=True, metavar="FLOAT|nan",
              help="Value of the cells outside each row's bounds.")
@click.option("--json", "json_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write every sample, the protocol and the environment as JSON.")
@click.option("--csv", "csv_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write one line per case and selector.")
@click.option("--plot", "plot_path", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Write a PNG bar plot (needs matplotlib: pip install 'logitreplay[plot]').")
@click.option("--recommend", is_flag=True, help="Print, per selector pair, the logits width where one overtakes "
              "the other (a dispatch rule from the measured cases), and add it to the JSON.")
@click.option("--isolate", is_flag=True, help="Run each selector in a child process of its own: a selector that "
              "hangs, crashes or breaks the CUDA context loses only its own result for that case.")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds one selector may spend on one case (verify + time) before its child is killed; "
              "implies --isolate [default with --isolate: 600].")
@click.option("--strict", is_flag=True, help="Exit 1 when a selector failed verification or raised, or a "
              "case was invalid.")
@user_errors
def replay_cmd(locations: tuple[str, ...], suite: str | None, scale: str | None, names: str,
               specs: tuple[str, ...], baseline: str | None, device: str, warmup: int | None,
               rounds: int | None, timer: str, l2: str, poison_text: str, json_path: Path | None,
               csv_path: Path | None, plot_path: Path | None, recommend: bool, isolate: bool,
               timeout_s: float | None, strict: bool) -> None:
    """Replay captured cases (archives: directories, .zip, URLs such as hf://datasets/...) or a built-in
    control suite against top-k selectors: verify every selector's output, time the verified ones, and
    print a table of median times and ratios to a baseline."""
    poison = _poison(poison_text)
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib: pip install 'logitreplay[plot]'")
    if device == "cuda" and not torch.cuda.is_available():
        raise click.ClickException("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is "
                                   f"False; torch {torch.__version__})")
    dev = torch.device(device)
    if not locations and suite is None:
        suite = "seed-controls"
    scale = scale or ("full" if dev.type == "cuda" else "small")
    selectors = _selectors(names, specs)
    columns = [s.name for s in selectors]
    if baseline is not None and baseline not in columns:
        raise click.BadParameter(f"{baseline!r} is not one of the selectors ({', '.join(columns)})",
                                 param_hint="--baseline")
    baseline = baseline or ("native" if "native" in columns else columns[0])
    notes: list[str] = []
    protocol = TimingProtocol.for_device(dev.type, warmup, rounds, l2, timer)  # type: ignore[arg-type]
    if dev.type == "cpu":
        label = "CPU wall-clock of algorithm models (not GPU kernel times)"
        warm = "the verification call" + (f" and {protocol.warmup} more calls" if protocol.warmup else "")
        notes.append(f"CPU timing: {warm} as warmup, then {protocol.rounds} alternating rounds of "
                     f"{protocol.samples_per_round} call (GPU protocol: {TimingProtocol.warmup} warmups, "
                     f"{TimingProtocol.rounds} rounds of {TimingProtocol.samples_per_round}); these are "
                     "algorithm models, use --device cuda for kernel times")
    else:
        label = f"CUDA kernel time, {'CUDA events' if timer == 'events' else 'CUPTI'}, L2 {l2}, graph replay"
    # The measured read bandwidth (bytes/s) for the floor, on CUDA.
    read_bandwidth: float | None = None
    cases, total, pinned = open_cases(list(locations), suite, scale)
    if total == 0:
        raise ArchiveError("nothing to replay: the archives hold no complete case")
    env = environment(dev)
    env["inputs"] = pinned + ([f"suite {suite} ({scale})"] if suite else [])
    extra_checks = device_checks(dev)
    if dev.type == "cuda":
        from logitreplay.replay import measure_read_bandwidth

        read_bandwidth = measure_read_bandwidth(dev)
        env["read_bandwidth_bytes_per_s"] = read_bandwidth
    result = ReplayResult(str(dev), label, protocol, env, baseline, columns, notes=notes)
    if isolate or timeout_s is not None:
        from logitreplay.replay.isolate import Job, merge, replay_isolated

        del cases  # each child opens the cases itself
        jobs = [Job(spec, sel.name, pinned, suite, scale, device, protocol.to_json(), poison,
                    read_bandwidth) for spec, sel in zip(_wanted(names, specs), selectors, strict=True)]
        per_selector: dict[str, dict[int, CaseResult]] = {}
        isolated = replay_isolated(jobs, total, 600.0 if timeout_s is None else timeout_s)
        for name, index, case_result in progress(isolated, total * len(jobs), "replay (isolated)"):
            per_selector.setdefault(name, {})[index] = case_result
        result.cases = merge(per_selector, columns, total)
        notes.append("--isolate: each selector ran in its own process; timing rounds alternate only within "
                     "a selector")
    else:
        stream = replay(cases, selectors, dev, protocol, poison, extra_checks, read_bandwidth)
        for case_result in progress(stream, total, "replay"):
            result.cases.append(case_result)
    # Off a terminal (logs, pipes, CI) rich would wrap the table at 80 columns; give it room instead.
    console = Console() if Console().is_terminal else Console(width=220)
    if dev.type == "cuda":
        from logitreplay.replay import sm_clock_mhz

        result.environment["sm_clock_mhz_end"] = sm_clock_mhz(dev)
    report.print_report(result, console)
    if recommend:
        from logitreplay.replay.recommend import recommend as dispatch_rules

        rules = dispatch_rules(result)
        result.recommendation = [r.to_json() for r in rules]
        console.print("dispatch rule (measured):" if rules else "dispatch rule: no two selectors were timed "
                      "on a common width")
        for rule in rules:
            console.print(f"  {rule.rule}", markup=False)
    if json_path is not None:
        write_json(result, json_path)
    if csv_path is not None:
        report.write_csv(result, csv_path)
    if plot_path is not None:
        report.write_plot(result, plot_path)
    if strict:
        bad = [f"{c.case_id}/{r.selector}" for c in result.cases for r in c.results if r.status in ("failed", "error")]
        bad += [f"{c.case_id} (invalid)" for c in result.cases if c.invalid]
        if bad:
            raise click.ClickException(f"--strict: {len(bad)} failed, errored or invalid: {', '.join(bad[:5])}"
                                       + (" ..." if len(bad) > 5 else ""))
