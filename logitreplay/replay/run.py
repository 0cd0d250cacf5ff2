"""A whole replay as one library call: `run_replay(ReplayConfig(...))`.

The command line, a Python user and a distributed launcher all replay through this function, so the
choices a run makes live here once: the device and its default scale and protocol, the selectors and
the baseline, the cases (optionally a subset of them, by place in the run), the environment probe and
the read bandwidth, and where the work runs: in a worker process that this one supervises (one for all
selectors, or one per selector under `isolate`; isolate.py), so that a selector that kills its process or
its CUDA context costs only its result on that case. What a front end adds is parsing and printing.

A `ReplayRun` records which places of the whole run its cases hold, so the runs of disjoint subsets
(e.g. one per rank) merge into one report with `merge_runs`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import torch

from logitreplay.errors import ArchiveError, ReplayError, SelectorError
from logitreplay.replay.engine import Unbuildable
from logitreplay.replay.environment import environment, sm_clock_mhz
from logitreplay.replay.isolate import Job, merge, start_server, supervise
from logitreplay.replay.protocol import TimingProtocol
from logitreplay.replay.results import CaseResult, ReplayResult
from logitreplay.replay.sources import case_costs, open_cases
from logitreplay.selectors import Selector, build, load_factory
from logitreplay.selectors.auto import RULE_ENV
from logitreplay.selectors.provenance import peer_versions
from logitreplay.selectors.registry import factory_spec, process_groups

T = TypeVar("T")
# progress(items, how many, label) -> the same items: a front end's progress display (identity by default)
Progress = Callable[[Iterable[T], int, str], Iterable[T]]
DEFAULT_SELECTORS = ("reference", "native", "deepselect")
ISOLATE_TIMEOUT_S = 600.0  # per (case, selector) in a worker of its own, when no timeout is given


def _no_progress(items: Iterable[T], total: int, label: str) -> Iterable[T]:
    return items


@dataclass(frozen=True)
class ReplayConfig:
    """Everything a replay depends on; each field's None means the default a replay on that device uses.

    `locations`: archives (paths, .zip, URLs such as hf://datasets/...); `suite`: a built-in control
    suite (seed-controls when no location is given); `scale`: the suite's scale (small on CPU, full on
    CUDA). `selectors`: registered names or `module:factory` specs, one column each; `baseline`: the
    column ratios divide by (native if selected, else the first). `case_globs`, `case_regex`, `controls`:
    which cases and which derived controls follow each; `case_indices`: only these places (0-based) of
    the run so chosen, for splitting one run over several replays (`merge_runs` joins them).
    `device`: "cpu", "cuda" or "cuda:N" (cuda when torch sees a device); `warmup`, `rounds`, `timer`,
    `l2`: the timing protocol (TimingProtocol.for_device's defaults); `poison`: the value of the cells
    outside each row's bounds. `isolate`: every selector in a child process of its own; `timeout_s`:
    seconds one selector may spend on one case there (implies `isolate`). `rule_path`: the dispatch
    rule the `auto` selector follows. `tolerate_recall`: a selector whose every row reaches this recall
    of the exact top-k's values passes check 3 as approximate (recall.py); `determinism`: reruns of every
    verified selector on every case, their index sets compared (determinism.py)."""

    locations: tuple[str, ...] = ()
    suite: str | None = None
    scale: str | None = None
    selectors: tuple[str, ...] = DEFAULT_SELECTORS
    baseline: str | None = None
    case_globs: tuple[str, ...] = ()
    case_regex: str | None = None
    controls: tuple[str, ...] = ()
    case_indices: tuple[int, ...] | None = None
    device: str | None = None
    warmup: int | None = None
    rounds: int | None = None
    timer: Literal["events", "cupti"] | None = None
    l2: Literal["cold", "warm"] | None = None
    poison: float = 1e30
    isolate: bool = False
    timeout_s: float | None = None
    rule_path: Path | None = None
    tolerate_recall: float | None = None
    determinism: int = 0


@dataclass
class ReplayRun:
    """A replay's report and where its cases sit in the whole run: `result.cases[i]` is the run's case
    `places[i]`; `config` is the configuration with its defaults filled in (`resolve`), `inputs` the
    archives' pinned locations (a Hub URL at its commit)."""

    result: ReplayResult
    places: list[int]
    config: ReplayConfig
    inputs: list[str] = field(default_factory=list)


def default_device() -> str:
    """CUDA whenever torch sees a device: a replay on a GPU machine times the kernels, not the CPU models."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve(config: ReplayConfig) -> ReplayConfig:
    """`config` with the device, suite and scale it defaults to filled in; a CUDA device torch cannot
    see is an error."""
    device = config.device or default_device()
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise ReplayError(f"device {device}: torch sees no CUDA device (torch.cuda.is_available() is False; "
                          f"torch {torch.__version__})")
    suite = config.suite if config.locations or config.suite is not None else "seed-controls"
    scale = config.scale or ("full" if torch.device(device).type == "cuda" else "small")
    return replace(config, device=device, suite=suite, scale=scale)


def build_selectors(specs: Sequence[str]) -> list[Selector]:
    """One selector per spec; a factory that fails stands in as `Unbuildable` (its error is its result on
    every case), while an unknown name or an unimportable module is an error, and so are two columns of
    one name."""
    if not specs:
        raise SelectorError("no selectors given")
    out: list[Selector] = []
    for spec in specs:
        load_factory(factory_spec(spec))
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


def _protocol(config: ReplayConfig, device: torch.device) -> tuple[TimingProtocol, str, list[str]]:
    """The timing protocol, what the times are, and the notes the device's protocol needs."""
    protocol = TimingProtocol.for_device(device.type, config.warmup, config.rounds, config.l2 or "cold",
                                         config.timer or "events")
    if device.type != "cuda":
        notes = [f"{option} {value} is ignored on CPU (wall clock, no L2 flush)"  # the warmup: protocol.describe
                 for option, value in (("--timer", config.timer), ("--l2", config.l2)) if value is not None]
        return protocol, "wall clock of the CPU algorithm models, not kernel times", notes
    timer = "CUPTI" if config.timer == "cupti" else "CUDA events"
    return protocol, f"CUDA kernel time, {timer}, L2 {config.l2 or 'cold'}, graph replay", []


def case_count(config: ReplayConfig) -> int:
    """How many cases `config` replays (its subset's size with `case_indices`), without reading one."""
    config = resolve(config)
    _, total, _ = open_cases(list(config.locations), config.suite, config.scale or "small",
                             controls=config.controls, case_globs=config.case_globs, case_regex=config.case_regex,
                             only=config.case_indices)
    return total


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where SIGINT raises KeyboardInterrupt, so that both stop a run the same way."""


class ReplayInterrupted(KeyboardInterrupt):
    """A replay stopped by SIGINT or SIGTERM (`signal`): `run` holds every case it finished, its report
    marked partial (`ReplayResult.partial`), ready to be written and resumed (resume.py). A caller that
    does not catch it sees the KeyboardInterrupt it derives from."""

    def __init__(self, run: ReplayRun, signal_name: str) -> None:
        super().__init__(signal_name)
        self.run = run
        self.signal = signal_name


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises `_Terminated` instead of ending the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        raise _Terminated("SIGTERM")

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def config_json(config: ReplayConfig) -> dict[str, Any]:
    """`config` as JSON (what a partial report records to be resumed with)."""
    return {f.name: (str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v)
            for f in fields(config) for v in [getattr(config, f.name)]}


def config_from_json(data: dict[str, Any]) -> ReplayConfig:
    """The inverse of `config_json`; `ReplayError` (one line) for a field this version does not know."""
    known = {f.name for f in fields(ReplayConfig)}
    odd = sorted(set(data) - known)
    if odd:
        raise ReplayError(f"the recorded configuration has fields this logitreplay does not know: {', '.join(odd)}")
    values: dict[str, Any] = {k: (tuple(v) if isinstance(v, list) else Path(v) if k == "rule_path" and v is not None
                                  else v) for k, v in data.items()}
    return ReplayConfig(**values)


def partial_mark(signal_name: str, done: int, total: int, config: ReplayConfig) -> dict[str, Any]:
    """`ReplayResult.partial` of a run stopped by `signal_name` after `done` of its `total` cases."""
    return {"signal": signal_name, "cases_done": done, "cases_total": total, "config": config_json(config)}


def case_ids(config: ReplayConfig) -> list[str]:
    """The id of each case of the run, in its order, from the metadata alone (no case is read)."""
    costs, _ = case_costs(list(config.locations), config.suite, config.scale or "small", config.controls,
                          config.case_globs, config.case_regex)
    ids = [cid for entry in costs for cid in entry.ids]
    return ids if config.case_indices is None else [ids[p] for p in sorted(set(config.case_indices))]


def _alone(config: ReplayConfig) -> bool:
    """Whether each selector runs in a worker of its own, supervised alone: under `isolate` or a timeout."""
    return config.isolate or config.timeout_s is not None


def worker_groups(config: ReplayConfig) -> list[list[int]]:
    """The selectors (indices into `config.selectors`) of each worker process a replay runs, one worker
    after another: one selector each under `isolate` or a timeout, else as few groups as keep two builds
    of one library or package apart (`process_groups`; one group when nothing clashes). The distributed
    replay asks too, to know whether a case's result is whole as its one worker yields it."""
    if _alone(config):
        return [[i] for i in range(len(config.selectors))]
    return process_groups(list(config.selectors))


def run_replay(config: ReplayConfig, progress: Progress = _no_progress) -> ReplayRun:
    """Replay `config`'s cases against its selectors: verify, time, and report (module docstring).

    Raises a `LogitreplayError` (one line) for a run that cannot start: unknown selectors, a baseline
    that is not one of them, a CUDA device torch cannot see, nothing to replay."""
    start_server()  # the workers' fork server: its import of torch overlaps what follows
    config = resolve(config)
    dev = torch.device(config.device or "cpu")
    if config.rule_path is not None:
        os.environ[RULE_ENV] = str(config.rule_path.resolve())  # the auto factory reads it, in children too
    selectors = build_selectors(config.selectors)
    columns = [s.name for s in selectors]
    if config.baseline is not None and config.baseline not in columns:
        raise SelectorError(f"baseline {config.baseline!r} is not one of the selectors ({', '.join(columns)})")
    baseline = config.baseline or ("native" if "native" in columns else columns[0])
    protocol, label, notes = _protocol(config, dev)
    _, total, pinned = open_cases(list(config.locations), config.suite, config.scale or "small",
                                      controls=config.controls, case_globs=config.case_globs,
                                      case_regex=config.case_regex, only=config.case_indices)
    ids = case_ids(config)
    if total == 0:
        raise ArchiveError("nothing to replay: the archives hold no complete case")
    if len(pinned) < len(config.locations):
        n = len(config.locations) - len(pinned)
        notes.append(f"{n} archive{'s' if n != 1 else ''} named more than once: each archive is replayed once")
    env = environment(dev)
    env["inputs"] = pinned + ([f"suite {config.suite} ({config.scale})"] if config.suite else [])
    env["peer_versions"] = peer_versions(list(config.selectors))
    read_bandwidth: float | None = None
    if dev.type == "cuda":
        from logitreplay.replay.timing_cuda import measure_read_bandwidth

        read_bandwidth = measure_read_bandwidth(dev)
        env["read_bandwidth_bytes_per_s"] = read_bandwidth
        torch.cuda.empty_cache()  # the workers replay on this device: keep none of its memory here
    result = ReplayResult(str(dev), label, protocol, env, baseline, columns, notes=notes)
    groups = process_groups(list(config.selectors))
    alone = _alone(config)
    job = Job((), (), pinned, config.suite, config.scale or "small", str(dev), protocol.to_json(), config.poison,
              read_bandwidth, controls=config.controls, case_globs=config.case_globs, case_regex=config.case_regex,
              only=config.case_indices, min_recall=config.tolerate_recall, determinism=config.determinism)
    jobs = [replace(job, specs=tuple(config.selectors[i] for i in w), names=tuple(columns[i] for i in w))
            for w in worker_groups(config)]
    timeout_s = (ISOLATE_TIMEOUT_S if config.timeout_s is None else config.timeout_s) if alone else None
    per_selector: dict[str, dict[int, CaseResult]] = {}
    places = list(range(total)) if config.case_indices is None else sorted(set(config.case_indices))
    try:
        with terminate_as_interrupt():
            for one in jobs:
                label = f"replay ({one.names[0]} alone)" if alone else "replay"
                for index, case_result in progress(supervise(one, total, timeout_s, notes, ids), total, label):
                    for name in one.names:
                        per_selector.setdefault(name, {})[index] = case_result
    except KeyboardInterrupt as stop:  # the workers are gone (isolate.py); keep what finished
        name = stop.args[0] if isinstance(stop, _Terminated) else "SIGINT"
        # Every case some selector finished (under --isolate, a selector's job may have gone further than
        # the next one's): its finished results are kept; `cases_done` counts the cases all of them finished.
        held = [i for i in range(total) if any(i in per_selector.get(c, {}) for c in columns)]
        done = sum(all(i in per_selector.get(c, {}) for c in columns) for i in held)
        result.cases = merge(per_selector, columns, total, held)
        result.partial = partial_mark(name, done, total, config)
        raise ReplayInterrupted(ReplayRun(result, [places[i] for i in held], config, pinned), name) from None
    result.cases = merge(per_selector, columns, total)
    if len(groups) > 1 and not alone:
        notes.append(f"kernel libraries or packages from different builds: the selectors ran in {len(groups)} "
                     "processes, no two builds of one in one; timing rounds alternate only within a process")
    elif len(groups) > 1 and not config.isolate:
        notes.append("kernel libraries or packages from different builds: each selector ran in its own process")
    if config.tolerate_recall is not None:
        notes.append(f"--tolerate-recall {config.tolerate_recall}: a selector whose every row holds at least that "
                     "fraction of the exact top-k's values passed as approximate (not exact)")
    if alone:
        notes.append("--isolate: each selector ran in its own process; timing rounds alternate only within "
                     "a selector")
    if dev.type == "cuda":
        result.environment["sm_clock_mhz_end"] = sm_clock_mhz(dev)
    return ReplayRun(result, places, config, pinned)


def merge_runs(runs: Sequence[ReplayRun]) -> ReplayRun:
    """One run from the runs of disjoint subsets of one configuration (e.g. one per rank), its cases in
    the run's order; the first run's environment, every run's notes once. Runs of different selectors,
    protocols or devices kinds, or two holding one place, are an error."""
    if not runs:
        raise ReplayError("no runs to merge")
    first = runs[0].result
    for run in runs[1:]:
        r = run.result
        if (r.selectors, r.protocol, r.baseline, r.clock_label) != (first.selectors, first.protocol, first.baseline,
                                                                     first.clock_label):
            raise ReplayError("runs of different selectors, baselines or protocols do not merge into one report")
    placed = sorted(((p, c) for run in runs for p, c in zip(run.places, run.result.cases, strict=True)),
                    key=lambda pc: pc[0])
    places = [p for p, _ in placed]
    if len(set(places)) < len(places):
        raise ReplayError("two runs replayed the same case place; merge runs of disjoint subsets")
    notes = list(dict.fromkeys(n for run in runs for n in run.result.notes))
    result = replace(first, cases=[c for _, c in placed], notes=notes)
    return ReplayRun(result, places, replace(runs[0].config, case_indices=None), list(dict.fromkeys(i for run in runs for i in run.inputs)))


__all__ = ["DEFAULT_SELECTORS", "Progress", "ReplayConfig", "ReplayInterrupted", "ReplayRun", "config_from_json",
           "config_json", "partial_mark", "build_selectors", "case_count",
           "default_device", "merge_runs", "resolve", "run_replay", "worker_groups"]
