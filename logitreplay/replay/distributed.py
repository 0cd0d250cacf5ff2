"""One replay over many ranks (GPUs, machines) on torch.distributed: `torchrun -m logitreplay replay ...`
or `replay --devices 0,1,...`.

Every rank lists the run's cases from their metadata alone (`sources.case_costs`; rank 0 pins the
archives first, so every rank lists, and later reads, the same commit of an `hf://` dataset), and takes
a deterministic share of them balanced by their estimated cost (`shard`: the costliest first, each to
the least loaded rank). It replays only its share, through `run.run_replay` like any replay (an
`hf://` archive is then read case by case: a rank fetches its cases' bytes, not the dataset). Results
travel through torch.distributed's key-value store (the one torchrun's rendezvous provides, or the one
`launch` hosts): each case as it finishes, and the case a rank is in before it starts it. Rank 0 replays
its share, waits for the others, and joins the runs with `run.merge_runs` into the report a single
process would have written, plus a `ranks` section (which rank, host and GPU replayed which case).

A selector that kills its process costs only its own result on that case already: `run_replay` runs
the selectors in worker processes it supervises (`run.worker_groups`: a rank's are a plain replay's).
A rank's own process can die too (the out-of-memory killer, a kill), and no launcher keeps the others
going after that (torchrun stops every worker), so each rank runs its replay in a child process under a
supervisor (`supervise`: torchrun's worker, or `launch` for all ranks at once). When the child dies
with cases left, the supervisor records why and starts another, which marks the case it died in as
lost and goes on with the next (with several workers one after another, whose cases are stored when
the share is done: with the rest of the share again). A child that dies before starting any case is
not restarted: its remaining cases are reported lost. `--strict` still decides the exit status: a
lost case is invalid.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from logitreplay.errors import ReplayError
from logitreplay.replay.results import CaseResult, ReplayResult
from logitreplay.replay.run import (
    Progress,
    ReplayConfig,
    ReplayInterrupted,
    ReplayRun,
    merge_runs,
    partial_mark,
    resolve,
    run_replay,
    terminate_as_interrupt,
    worker_groups,
)
from logitreplay.replay.sources import EntryCost, case_costs

CHILD_ENV = "LOGITREPLAY_RANK_CHILD"  # set in the child a supervisor starts: it replays, not supervises
_PREFIX = "logitreplay/replay"
_POLL_S = 0.2
_STOP_WAIT_S = 60  # how long, after a signal, rank 0 waits for the others' finished cases
_TIMEOUT = timedelta(hours=2)  # the store's wait for a key another rank sets (rank 0's pinned inputs)


@dataclass(frozen=True)
class Rank:
    """This process's place in the job, as torchrun (or `launch`) gives it in the environment."""

    rank: int
    world: int
    local_rank: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Rank | None:
        """None outside a distributed launch (no WORLD_SIZE and RANK)."""
        if "WORLD_SIZE" not in env or "RANK" not in env:
            return None
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])))


def shard(costs: Sequence[int], world: int) -> list[list[int]]:
    """Each rank's share of the items (indices into `costs`, in order): the costliest item first, each to
    the rank with the least cost so far (the lowest rank on a tie). Deterministic: every rank computes
    the same shares from the same costs."""
    loads = [0] * world
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        shares[r].append(i)
        loads[r] += costs[i]
    return [sorted(s) for s in shares]


# -- the store


def _connect(rank: Rank) -> Any:
    """The job's key-value store, under this module's prefix: torchrun's (its agent's), else the one rank
    0 hosts at MASTER_ADDR:MASTER_PORT (torch.distributed's env:// rendezvous)."""
    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous("env://", rank=rank.rank, world_size=rank.world, timeout=_TIMEOUT))
    return dist.PrefixStore(_PREFIX, store)


def _get(store: Any, key: str) -> str | None:
    return store.get(key).decode() if store.check([key]) else None


def _lost(case_id: str, why: str) -> CaseResult:
    """The result of a case its rank did not finish: invalid (so `--strict` fails), saying why."""
    return CaseResult(case_id, 0, 0, 0, "-", 0, "lost", 0, invalid=f"lost: {why}")


# -- a rank


def _costs(config: ReplayConfig) -> tuple[list[EntryCost], list[str]]:
    return case_costs(list(config.locations), config.suite, config.scale or "small", config.controls,
                      config.case_globs, config.case_regex)


def replay(config: ReplayConfig, progress: Progress[Any]) -> ReplayRun | None:
    """This rank's part of the replay (module docstring): rank 0 returns the whole run, the others None."""
    me = Rank.from_env()
    if me is None:
        raise ReplayError("a distributed replay needs RANK and WORLD_SIZE (torchrun, or replay --devices)")
    store = _connect(me)
    config = resolve(config)
    if me.rank == 0:
        entries, pinned = _costs(config)
        if not store.check(["inputs"]):  # a restarted rank 0 keeps the locations pinned the first time
            store.set("inputs", json.dumps(pinned))
    store.wait(["inputs"])
    pinned = json.loads(store.get("inputs"))
    config = replace(config, locations=tuple(pinned))
    if me.rank != 0:
        entries, _ = _costs(config)
    if not entries:
        raise ReplayError("nothing to replay: the archives hold no complete case")
    ids = [cid for e in entries for cid in e.ids]
    per = len(entries[0].ids)
    shares = [[e * per + j for e in share for j in range(per)] for share in shard([e.cost for e in entries], me.world)]
    device = config.device or "cpu"
    if device == "cuda":
        device = f"cuda:{me.local_rank}"
    where = f"{device} on {socket.gethostname()}"
    try:
        with terminate_as_interrupt():
            _replay_share(store, me.rank, replace(config, device=device), shares[me.rank], ids, where, progress)
            return _collect(store, config, shares, ids) if me.rank == 0 else None
    except KeyboardInterrupt as stop:  # the supervisor passed a SIGINT or SIGTERM on to every rank
        name = stop.signal if isinstance(stop, ReplayInterrupted) else "SIGTERM" if str(stop) == "SIGTERM" else "SIGINT"
        if me.rank != 0:  # its finished cases are in the store (`_replay_share`); rank 0 writes the report
            raise SystemExit(128 + signal.Signals[name].value) from None
        summary = _get(store, "run/0")
        template = stop.run.result if isinstance(stop, ReplayInterrupted) else \
            ReplayResult.from_json(json.loads(summary)) if summary else None
        if template is None:
            raise
        raise ReplayInterrupted(_stopped(store, config, len(shares), ids, name, template), name) from None


def _stopped(store: Any, config: ReplayConfig, world: int, ids: list[str], signal_name: str,
             template: ReplayResult) -> ReplayRun:
    """Rank 0, stopped by a signal: once every rank has stored what it finished (or `_STOP_WAIT_S` has
    passed), the partial run of all ranks' finished cases with the whole run's configuration, so that
    `replay --resume` replays exactly the others."""
    deadline = time.monotonic() + _STOP_WAIT_S
    while time.monotonic() < deadline and not all(
            store.check([f"stopped/{r}"]) or store.check([f"done/{r}"]) for r in range(1, world)):
        time.sleep(_POLL_S)
    places = [p for p in range(len(ids)) if store.check([f"case/{p}"])]
    result = replace(template, cases=[CaseResult.from_json(json.loads(store.get(f"case/{p}"))) for p in places])
    result.partial = partial_mark(signal_name, len(places), len(ids), config)
    return ReplayRun(result, places, config, list(config.locations))


def _replay_share(store: Any, rank: int, config: ReplayConfig, share: list[int], ids: list[str], where: str,
                  progress: Progress[Any]) -> None:
    """Replay the places of `share` not yet in the store; a case a previous child of this rank died in is
    lost, not replayed again. Ends with the rank's record (`rank/R`) and `done/R`."""
    lost = json.loads(_get(store, f"lost/{rank}") or "[]")
    at = _get(store, f"at/{rank}")
    if at and not store.check([f"case/{at}"]):  # this rank's previous child died in this case
        why = f"rank {rank} ({where}) {_get(store, f'died/{rank}') or 'died'} during this case"
        store.set(f"case/{at}", json.dumps(_lost(ids[int(at)], why).to_json()))
        lost.append(ids[int(at)])
        store.set(f"lost/{rank}", json.dumps(lost))
        store.set(f"at/{rank}", "")
    remaining = [p for p in share if not store.check([f"case/{p}"])]
    gpu: str | None = None
    workers: list[list[str]] = []  # the selectors of each worker process this child ran, in order
    if remaining:
        # One worker yields each case's whole result: stored as it comes. Several workers one after another
        # (builds kept apart, or --isolate) each yield their selectors' part: the cases are stored when the
        # run returns. Either way the case in progress is in the store before each worker starts it.
        groups = worker_groups(config)
        try:
            run = run_replay(replace(config, case_indices=tuple(remaining)), lambda items, n, label: progress(
                _tracked(store, rank, remaining, items, len(groups) == 1), n, label))
        except ReplayInterrupted as stop:  # keep what this rank finished for rank 0's partial report
            _store_cases(store, stop.run)
            store.set(f"stopped/{rank}", stop.signal)
            raise
        _store_cases(store, run)
        store.set(f"run/{rank}", json.dumps(replace(run.result, cases=[]).to_json()))
        gpu = run.result.environment.get("gpu")
        workers = [[run.result.selectors[i] for i in g] for g in groups]
    record = {"rank": rank, "host": socket.gethostname(), "device": config.device, "gpu": gpu,
              "cases": [ids[p] for p in share], "lost": lost, **({"workers": workers} if workers else {})}
    store.set(f"rank/{rank}", json.dumps(record))
    store.set(f"done/{rank}", "1")


def _store_cases(store: Any, run: ReplayRun) -> None:
    """Each case `run` finished, under its place in the whole run (a case of an interrupted run of one
    selector at a time that some selector did not reach is left for `replay --resume`)."""
    for place, case in zip(run.places, run.result.cases, strict=True):
        if case.invalid or all(case.result(s) is not None for s in run.result.selectors):
            store.set(f"case/{place}", json.dumps(case.to_json()))


def _tracked(store: Any, rank: int, places: list[int], items: Iterable[tuple[int, CaseResult]], whole: bool
             ) -> Iterator[tuple[int, CaseResult]]:
    """A worker's (index, result) pairs over `places` (one per case, in order), as `run_replay` passes
    them to its progress, with the place in progress in the store before each case is computed; each
    result is stored as it comes where it is `whole` (the run's only worker, so all its selectors). A
    worker of several leaves its last place in the store: a rank that dies before the next worker's
    first case loses that case, so that its restarts, each losing one case, come to an end."""
    it = iter(items)
    for place in places:
        store.set(f"at/{rank}", str(place))
        store.add(f"started/{rank}", 1)
        try:
            index, case = next(it)
        except StopIteration:
            break
        if whole:
            store.set(f"case/{places[index]}", json.dumps(case.to_json()))
        yield index, case
    if whole:
        store.set(f"at/{rank}", "")
    yield from it


def _collect(store: Any, config: ReplayConfig, shares: list[list[int]], ids: list[str]) -> ReplayRun:
    """Rank 0, its own share done: wait for every rank, then one run from all of them (module docstring)."""
    world = len(shares)
    while not all(store.check([f"done/{r}"]) or store.check([f"gave-up/{r}"]) for r in range(world)):
        time.sleep(_POLL_S)
    summaries = [_get(store, f"run/{r}") for r in range(world)]
    first = next((t for t in summaries if t), None)
    if first is None:
        raise ReplayError("no rank finished its share of the replay")
    own = ReplayResult.from_json(json.loads(first))
    runs, ranks, notes = [], [], []
    for r, share in enumerate(shares):
        missing = [p for p in share if not store.check([f"case/{p}"])]
        gave_up = _get(store, f"gave-up/{r}")
        if gave_up is not None:
            for p in missing:
                store.set(f"case/{p}", json.dumps(_lost(ids[p], f"rank {r}: {gave_up}").to_json()))
            notes.append(f"rank {r} stopped: {gave_up}; its cases not replayed are reported lost")
        written = _get(store, f"rank/{r}")  # the record a rank writes when its share is done
        record: dict[str, Any] = json.loads(written) if written else {
            "rank": r, "host": None, "device": "", "gpu": None, "cases": [ids[p] for p in share],
            "lost": [ids[p] for p in missing]}
        ranks.append(record)
        summary = summaries[r]
        result = ReplayResult.from_json(json.loads(summary)) if summary else replace(own, cases=[])
        result.cases = [CaseResult.from_json(json.loads(store.get(f"case/{p}"))) for p in share]
        runs.append(ReplayRun(result, list(share), config, list(config.locations)))
        notes += [f"rank {r} ({record['device']} on {record['host']}) died during case {cid}; the rank went on "
                  "with the rest of its share" for cid in (record["lost"] if written else [])]
    merged = merge_runs([run for run in runs if run.places])
    merged.result.device = own.device.split(":")[0] if ":" not in (config.device or "") else own.device
    merged.result.environment = own.environment
    merged.result.ranks = ranks
    merged.result.notes += notes
    return merged


# -- supervisors


def supervise(store: Any, envs: Mapping[int, Mapping[str, str]], argv: Sequence[str]) -> int:
    """Run `python -m logitreplay ARGV` once per rank (`envs`: each rank's environment) and start a rank's
    child again when it dies with cases left, as long as the one that died had started a case (module
    docstring). Returns rank 0's exit status when it is supervised here, else 0: a rank's lost cases are
    in the report, which rank 0 writes."""
    cmd = [sys.executable, "-m", "logitreplay", *argv]

    def start(r: int) -> tuple[subprocess.Popen[bytes], int]:
        # A session of its own: a Ctrl-C at the terminal reaches the supervisor alone, which passes it on once.
        return (subprocess.Popen(cmd, env={**envs[r], CHILD_ENV: "1"}, start_new_session=True),
                store.add(f"started/{r}", 0))

    children = {r: start(r) for r in envs}
    status = 0
    try:
        with terminate_as_interrupt():
            status = _watch(store, children, start)
    except KeyboardInterrupt as stop:  # SIGINT, or SIGTERM (terminate_as_interrupt): each rank ends its run
        sig = signal.SIGTERM if str(stop) == "SIGTERM" else signal.SIGINT
        for proc, _ in children.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        deadline = time.monotonic() + _STOP_WAIT_S + 30
        while time.monotonic() < deadline and any(proc.poll() is None for proc, _ in children.values()):
            time.sleep(_POLL_S)
        first = children.get(0)
        status = first[0].returncode if first is not None and first[0].returncode is not None else 128 + sig.value
    finally:  # an error here, or a rank that did not end in time, leaves no child behind
        for proc, _ in children.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    return status


def _watch(store: Any, children: dict[int, tuple[subprocess.Popen[bytes], int]],
           start: Any) -> int:
    """Poll the ranks' children until every one has ended, starting again one that died with cases left
    (`supervise`); returns rank 0's exit status when it is supervised here, else 0."""
    status = 0
    while children:
        time.sleep(_POLL_S)
        for r, (proc, started) in list(children.items()):
            code = proc.poll()
            if code is None:
                continue
            del children[r]
            if store.check([f"done/{r}"]):
                status = code if r == 0 else status
                continue
            why = _death(code)
            if store.add(f"started/{r}", 0) > started:
                store.set(f"died/{r}", why)
                children[r] = start(r)
            else:
                store.set(f"gave-up/{r}", f"its process {why} before its next case")
                status = code if r == 0 else status
    return status


def _death(code: int) -> str:
    return f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"


def supervise_rank(argv: Sequence[str]) -> int:
    """torchrun's worker: supervise this rank's replay in a child (module docstring)."""
    me = Rank.from_env()
    assert me is not None
    store = _connect(me)  # rank 0 hosts it here when torchrun's agent does not; the child connects to it
    return supervise(store, {me.rank: {**os.environ, "TORCHELASTIC_USE_AGENT_STORE": "True"}}, argv)


def launch(devices: Sequence[str], argv: Sequence[str], cuda: bool) -> int:
    """`replay --devices 0,1,...`: one rank per device on this machine, under one supervisor that hosts the
    store (CUDA: rank i sees the listed devices and takes the i-th; CPU: `devices` only counts ranks)."""
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=_TIMEOUT)
    base = {**os.environ, "WORLD_SIZE": str(len(devices)), "LOCAL_WORLD_SIZE": str(len(devices)),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    if cuda:
        base["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    envs = {r: {**base, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(len(devices))}
    return supervise(dist.PrefixStore(_PREFIX, store), envs, argv)


def in_rank() -> bool:
    """True in a rank's replaying child (started by `supervise`)."""
    return os.environ.get(CHILD_ENV) == "1"


def supervising() -> bool:
    """True where this process is to launch or supervise ranks: `--devices` given, or a torchrun worker."""
    return not in_rank() and Rank.from_env() is not None


def start(devices: str | None, config: ReplayConfig, argv: Sequence[str]) -> int:
    """`replay --devices LIST` (launch a rank per device) or a torchrun worker (supervise its rank): the
    exit status. `argv` is the command's arguments; the children get them without `--devices`."""
    rest = _without_devices(argv)
    if devices is None:
        return supervise_rank(rest)
    if Rank.from_env() is not None:
        raise ReplayError("--devices launches the ranks itself; under torchrun leave it out")
    listed = [d.strip() for d in devices.split(",")]
    if not all(d.isdigit() for d in listed) or len(set(listed)) < len(listed):
        raise ReplayError(f"--devices {devices}: expected distinct device numbers, e.g. 0,1,2,3")
    cuda = (resolve(config).device or "cpu").startswith("cuda")
    return launch(listed, rest, cuda)


def _without_devices(argv: Sequence[str]) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--devices":
            skip = True
        elif not arg.startswith("--devices="):
            out.append(arg)
    return out


__all__ = ["CHILD_ENV", "Rank", "in_rank", "launch", "replay", "shard", "start", "supervise", "supervise_rank",
           "supervising"]
