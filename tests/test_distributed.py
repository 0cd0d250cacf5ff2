"""A replay over ranks on CPU with torch.distributed's store: `replay --devices` and `torchrun -m
logitreplay replay` give the single-process report case for case (statuses, checks, selectors, order),
plus a ranks section; the shares are deterministic and cost-balanced; a killed rank loses only the case
it was in, and the report says which."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.datasets import hub
from logitreplay.replay.distributed import CHILD_ENV, shard
from logitreplay.replay.merge import differences
from logitreplay.replay.results import ReplayResult, read_json
from logitreplay.replay.sources import case_costs, open_cases
from logitreplay.selectors.reference import ReferenceSelector
from tests.hub_server import LoopbackHub
from tests.test_merge import tiny_archive

ROOT = Path(__file__).resolve().parents[1]
KILL_ENV = "LOGITREPLAY_TEST_KILL_CASE"
KILL_RANK_ENV = "LOGITREPLAY_TEST_KILL_RANK"
WITNESS_ENV = "LOGITREPLAY_TEST_WITNESS"


def _rank_process() -> int:
    """The rank's replaying process: the topmost of this process and its ancestors started with CHILD_ENV
    set (the child a supervisor starts; its workers, forked or from a fork server, inherit it), so not
    the worker the selector runs in, whose death costs only its own result."""

    def parent(pid: int) -> int:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        return int(next(line.split()[1] for line in status if line.startswith("PPid:")))

    def started_as_rank(pid: int) -> bool:
        return pid > 1 and f"{CHILD_ENV}=1".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")

    pid = os.getpid()
    assert started_as_rank(pid), "not in a rank"
    while started_as_rank(parent(pid)):
        pid = parent(pid)
    return pid


class _Killer(ReferenceSelector):
    """The reference, except that on the case named in KILL_ENV it kills its rank's process (SIGKILL), as
    the out-of-memory killer would: not the worker it runs in, whose death costs only its own result."""

    name = "killer"

    def supports(self, case: Case, device: torch.device) -> str | None:
        if case.case_id == os.environ.get(KILL_ENV):
            os.kill(_rank_process(), signal.SIGKILL)
        return super().supports(case, device)


def make_killer() -> _Killer:
    """The killer; in the rank named in KILL_RANK_ENV it kills its process as it is built (before any case)."""
    if os.environ.get(KILL_RANK_ENV) is not None and os.environ.get(KILL_RANK_ENV) == os.environ.get("RANK"):
        os.kill(os.getpid(), signal.SIGKILL)
    return _Killer()


class _Witness(ReferenceSelector):
    """The reference, writing a line `RANK pid case` to the file named in WITNESS_ENV for each case it
    is asked about: which process of which rank replayed it."""

    name = "witness"

    def supports(self, case: Case, device: torch.device) -> str | None:
        with open(os.environ[WITNESS_ENV], "a") as f:
            f.write(f"{os.environ.get('RANK', '-')} {os.getpid()} {case.case_id}\n")
        return super().supports(case, device)


def make_witness() -> _Witness:
    return _Witness()


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_archive(tmp_path_factory.mktemp("ranks") / "a.zarr", cases=8)


@given(st.lists(st.integers(0, 10**9), max_size=40), st.integers(1, 6))
def test_shares_are_deterministic_disjoint_and_balanced(costs: list[int], world: int) -> None:
    shares = shard(costs, world)
    assert shares == shard(costs, world) and len(shares) == world
    assert sorted(i for s in shares for i in s) == list(range(len(costs)))
    assert all(s == sorted(s) for s in shares)
    loads = [sum(costs[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(costs, default=0)  # each item went to the least loaded rank


def test_costs_list_the_cases_open_cases_replays_by_their_bytes(archive: str) -> None:
    entries, pinned = case_costs([archive], None, "small", controls=("matched",), case_globs=("t[1-6]",))
    stream, total, opened = open_cases([archive], None, "small", controls=("matched",), case_globs=("t[1-6]",))
    assert [cid for e in entries for cid in e.ids] == [c.case_id for c in stream]
    assert total == 12 and pinned == opened
    # t1..t6: 8..28 rows of 128, 192, 64, ... columns of float32 and 8 selected per row, for the case and its control
    assert [e.cost for e in entries] == [2 * r * (c * 4 + 32) for r, c in
                                         zip(range(8, 29, 4), [128, 192, 64, 128, 192, 64], strict=True)]


def _replay(archive: str, out: Path, *extra: str, env: dict[str, str] | None = None,
            launcher: tuple[str, ...] = (sys.executable, "-m", "logitreplay")) -> subprocess.CompletedProcess[str]:
    cmd = [*launcher, "replay", archive, "--device", "cpu", "--selectors", "reference", "--selector",
           "tests.test_distributed:make_killer", "--rounds", "1", "--json", str(out), *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def single(archive: str, tmp_path_factory: pytest.TempPathFactory) -> ReplayResult:
    out = tmp_path_factory.mktemp("single") / "one.json"
    done = _replay(archive, out)
    assert done.returncode == 0, done.stderr
    return read_json(out)


def _check_ranks(report: ReplayResult, world: int) -> None:
    """Every case in exactly one rank's share, the shares the deterministic cost-balanced ones."""
    assert [r["rank"] for r in report.ranks] == list(range(world))
    assert sorted(c for r in report.ranks for c in r["cases"]) == sorted(c.case_id for c in report.cases)
    entries, _ = case_costs(report.environment["inputs"], None, "small")
    ids = [e.ids[0] for e in entries]
    assert [r["cases"] for r in report.ranks] == [[ids[i] for i in s] for s in shard([e.cost for e in entries], world)]


@pytest.mark.slow
def test_four_cpu_ranks_give_the_single_process_report(archive: str, single: ReplayResult, tmp_path: Path) -> None:
    done = _replay(archive, tmp_path / "four.json", "--devices", "0,1,2,3")
    assert done.returncode == 0, done.stderr
    four = read_json(tmp_path / "four.json")
    assert differences(single, four) == []
    assert {r.status for c in four.cases for r in c.results} == {"ok"}
    _check_ranks(four, 4)
    assert all(r["device"] == "cpu" and r["gpu"] is None and r["lost"] == [] for r in four.ranks)


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, ...]:
    """Two releases of one library family staged side by side (on CPU their adapters only say they need
    CUDA) among plugins and a bundled selector: the `--selector` options of a replay that needs two
    worker processes, the second holding the later release's selectors."""
    root = tmp_path_factory.mktemp("staged")
    old, new = root / "flashinfer-0.7.2.post1", root / "flashinfer-0.7.4"
    old.mkdir()
    new.mkdir()
    specs = [f"flashinfer-ragged@{old}", "native", f"flashinfer-ragged@{new}", f"flashinfer-paged@{new}",
             "tests.test_distributed:make_witness"]
    return tuple(arg for spec in specs for arg in ("--selector", spec))


WORKERS = [["reference", "killer", "flashinfer-ragged@flashinfer-0.7.2.post1", "native", "witness"],
           ["flashinfer-ragged@flashinfer-0.7.4", "flashinfer-paged@flashinfer-0.7.4"]]


@pytest.fixture(scope="module")
def single_grouped(archive: str, releases: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> ReplayResult:
    tmp = tmp_path_factory.mktemp("grouped")
    done = _replay(archive, tmp / "one.json", *releases, env={WITNESS_ENV: str(tmp / "witness")})
    assert done.returncode == 0, done.stderr
    return read_json(tmp / "one.json")


@pytest.mark.slow
def test_ranks_run_one_worker_per_group_of_builds_and_give_the_single_process_report(
        archive: str, releases: tuple[str, ...], single_grouped: ReplayResult, tmp_path: Path) -> None:
    """As in a single process, the selectors run in as few workers as keep the two releases apart: on each
    rank one worker for the first release with everything else, then one for the second."""
    witness = tmp_path / "witness"
    done = _replay(archive, tmp_path / "two.json", *releases, "--devices", "0,1", env={WITNESS_ENV: str(witness)})
    assert done.returncode == 0, done.stderr
    two = read_json(tmp_path / "two.json")
    assert differences(single_grouped, two) == []
    assert [r["workers"] for r in two.ranks] == [WORKERS, WORKERS]
    assert any("the selectors ran in 2 processes" in n for n in two.notes), two.notes
    seen = [line.split() for line in witness.read_text().splitlines()]
    pids = {rank: {pid for r, pid, _ in seen if r == rank} for rank in ("0", "1")}
    assert all(len(p) == 1 for p in pids.values()) and pids["0"] != pids["1"]  # one worker of it per rank
    assert {rank: sorted(c for r, _, c in seen if r == rank) for rank in ("0", "1")} == \
        {str(r["rank"]): sorted(r["cases"]) for r in two.ranks}
    assert {r.status for c in two.cases for r in c.results} == {"ok", "unsupported"}
    _check_ranks(two, 2)


@pytest.mark.slow
@pytest.mark.parametrize("grouped", [False, True], ids=["one-worker", "two-workers"])
def test_a_killed_rank_loses_only_its_case_in_progress(archive: str, grouped: bool, releases: tuple[str, ...],
                                                       request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Whether a rank's selectors run in one worker (each case stored as it finishes) or several one
    after another (its cases stored when its share is done, the killed rank's share replayed again)."""
    single: ReplayResult = request.getfixturevalue("single_grouped" if grouped else "single")
    extra = releases if grouped else ()
    done = _replay(archive, tmp_path / "k.json", *extra, "--devices", "0,1", "--strict",
                   env={KILL_ENV: "t3", WITNESS_ENV: str(tmp_path / "witness")})
    assert done.returncode == 1 and "--strict: 1 failed, errored or invalid: t3 (invalid)" in done.stderr
    report = read_json(tmp_path / "k.json")
    lost = next(c for c in report.cases if c.case_id == "t3")
    (rank,) = [r for r in report.ranks if "t3" in r["cases"]]
    assert lost.invalid == f"lost: rank {rank['rank']} (cpu on {rank['host']}) was killed by SIGKILL during this case"
    assert rank["lost"] == ["t3"] and all(r["lost"] == [] for r in report.ranks if r is not rank)
    assert [c.case_id for c in report.cases] == [c.case_id for c in single.cases]
    others = ReplayResult.from_json(report.to_json())
    others.cases = [c for c in others.cases if c.case_id != "t3"]
    others.notes = [n for n in others.notes if "died during case t3" not in n]
    whole = ReplayResult.from_json(single.to_json())
    whole.cases = [c for c in whole.cases if c.case_id != "t3"]
    assert differences(whole, others) == []
    assert len(report.notes) == len(single.notes) + 1


@pytest.mark.slow
def test_a_rank_that_dies_before_any_case_is_not_restarted_and_its_cases_are_lost(
        archive: str, single: ReplayResult, tmp_path: Path) -> None:
    done = _replay(archive, tmp_path / "g.json", "--devices", "0,1", env={KILL_RANK_ENV: "1"})
    assert done.returncode == 0, done.stderr  # without --strict: RESULTS FAILED, exit status 0
    report = read_json(tmp_path / "g.json")
    assert [c.case_id for c in report.cases] == [c.case_id for c in single.cases]
    gone = report.ranks[1]["cases"]
    assert gone and report.ranks[1]["lost"] == gone and report.ranks[0]["lost"] == []
    why = "lost: rank 1: its process was killed by SIGKILL before its next case"
    assert {c.case_id: c.invalid for c in report.cases} == {c: why if c in gone else None
                                                            for c in (x.case_id for x in single.cases)}
    assert "rank 1 stopped: its process was killed by SIGKILL before its next case" in report.notes[-1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun is not installed beside this python")
def test_torchrun_gives_the_single_process_report(archive: str, single: ReplayResult, tmp_path: Path) -> None:
    torchrun = str(Path(sys.executable).parent / "torchrun")
    done = _replay(archive, tmp_path / "t.json",
                   launcher=(torchrun, "--standalone", "--nproc-per-node", "2", "-m", "logitreplay"))
    assert done.returncode == 0, done.stderr
    report = read_json(tmp_path / "t.json")
    assert differences(single, report) == []
    _check_ranks(report, 2)


@pytest.mark.slow
def test_ranks_read_a_hub_dataset_case_by_case_not_each_the_whole(archive: str, tmp_path: Path) -> None:
    """Each stored file of a case is fetched as often over two ranks as by one process: every rank reads
    its own cases' bytes (after the listing, which each rank reads), never the whole dataset."""
    with LoopbackHub() as loopback:
        loopback.publish_folder("org/tiny", hub.stage(Archive.open(archive), "org/tiny", tmp_path / "stage").path)
        env = {"HF_ENDPOINT": loopback.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""}
        counts = []
        for name, extra in (("one", ()), ("two", ("--devices", "0,1"))):
            loopback.requests.clear()
            done = _replay("hf://datasets/org/tiny", tmp_path / f"{name}.json", *extra, env=env)
            assert done.returncode == 0, done.stderr
            data = [path for _, path, _ in loopback.requests if re.search(r"/cases/[^/]+/.+", path)
                    and not path.endswith("zarr.json")]
            counts.append({path: data.count(path) for path in data})
    assert counts[0] and counts[1] == counts[0]
    two = read_json(tmp_path / "two.json")
    assert differences(read_json(tmp_path / "one.json"), two) == []
    assert re.fullmatch(r"hf://datasets/org/tiny@[0-9a-f]{40}", two.environment["inputs"][0])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
                    reason="torchrun is not installed beside this python")
def test_two_nodes_through_torchruns_rendezvous_give_the_single_process_report(
        archive: str, single: ReplayResult, tmp_path: Path) -> None:
    """docs/distributed.md's multi-node command, both "nodes" on this machine."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = str(Path(sys.executable).parent / "torchrun")

    def node(rank: int) -> tuple[str, ...]:
        return (torchrun, "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank), "--rdzv-backend",
                "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "test", "-m", "logitreplay")

    cmd = [*node(1), "replay", archive, "--device", "cpu", "--selectors", "reference", "--selector",
           "tests.test_distributed:make_killer", "--rounds", "1", "--json", str(tmp_path / "n.json")]
    other = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        done = _replay(archive, tmp_path / "n.json", launcher=node(0))
    finally:
        other.wait(timeout=300)
    assert done.returncode == 0 and other.returncode == 0, done.stderr
    report = read_json(tmp_path / "n.json")
    assert differences(single, report) == []
    _check_ranks(report, 2)


def test_devices_is_checked_before_any_rank_starts(archive: str, monkeypatch: pytest.MonkeyPatch) -> None:
    res = CliRunner().invoke(main, ["replay", archive, "--device", "cpu", "--devices", "0,0"])
    assert res.exit_code == 1 and "--devices 0,0: expected distinct device numbers" in res.output
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    res = CliRunner().invoke(main, ["replay", archive, "--device", "cpu", "--devices", "0,1"])
    assert res.exit_code == 1 and "under torchrun leave it out" in res.output
