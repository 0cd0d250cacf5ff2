"""`run_replay` as a library call: a configuration in, a report out, with no CLI in between; a run split
into subsets of cases (as ranks of a distributed replay would) merges back into the whole run's report."""

from __future__ import annotations

import pytest

from logitreplay.archive import Archive
from logitreplay.errors import ArchiveError, ReplayError, SelectorError
from logitreplay.replay import ReplayConfig, case_count, merge_runs, run_replay
from logitreplay.replay.results import validate
from logitreplay.selectors import provenance
from tests.plugins import plugin_case

SELECTORS = ("reference", "tests.plugins:make_good")


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("run") / "a.zarr"
    a = Archive.create(path)
    for i in range(3):
        a.write(plugin_case(f"p{i}"))
    return str(path)


def _config(archive: str, **kw: object) -> ReplayConfig:
    return ReplayConfig(locations=(archive,), selectors=SELECTORS, device="cpu", rounds=1, **kw)  # type: ignore[arg-type]


def _statuses(cases: list) -> list[tuple[str, list[str]]]:
    return [(c.case_id, [r.status for r in c.results]) for c in cases]


def test_a_replay_is_one_call_with_the_cli_defaults(archive: str) -> None:
    run = run_replay(_config(archive))
    result = run.result
    assert result.selectors == ["reference", "good"] and result.baseline == "reference"
    assert _statuses(result.cases) == [(f"p{i}", ["ok", "ok"]) for i in range(3)]
    assert run.places == [0, 1, 2] and len(run.inputs) == 1
    assert run.config.device == "cpu" and run.config.scale == "small"
    assert result.environment["inputs"] == run.inputs and "torch" in result.environment


def test_a_report_records_its_kernels_sources_and_its_peers_versions(archive: str) -> None:
    """Which code made the figures: the bundled kernels' source digests on the run's device kind (the CPU
    models here), and a peer's version (or the library file it was given)."""
    run = run_replay(ReplayConfig(locations=(archive,), selectors=("reference", "vllm-native@/nowhere/lib.so"),
                                  device="cpu", rounds=1))
    env = run.result.environment
    assert env["kernel_sources"] == provenance.kernel_sources("cpu")
    assert set(env["kernel_sources"]) == {"native", "deepselect", "split"}
    assert env["peer_versions"] == {"vllm-native@/nowhere/lib.so": "from lib.so"}
    validate(run.result.to_json())


def test_subsets_of_cases_merge_into_the_whole_run(archive: str) -> None:
    assert case_count(_config(archive, controls=("matched",))) == 6
    config = _config(archive, controls=("matched",))
    parts = [run_replay(_config(archive, controls=("matched",), case_indices=tuple(range(rank, 6, 2))))
             for rank in (1, 0)]
    assert [c.case_id for c in parts[0].result.cases] == ["p0~matched", "p1~matched", "p2~matched"]
    merged = merge_runs(parts)
    whole = run_replay(config)
    assert merged.places == list(range(6))
    assert _statuses(merged.result.cases) == _statuses(whole.result.cases)
    assert merged.result.notes == whole.result.notes


def test_merging_refuses_overlapping_or_unlike_runs(archive: str) -> None:
    one = run_replay(_config(archive, case_indices=(0,)))
    with pytest.raises(ReplayError, match="same case place"):
        merge_runs([one, one])
    other = run_replay(ReplayConfig(locations=(archive,), selectors=("reference",), device="cpu", rounds=1,
                                    case_indices=(1,)))
    with pytest.raises(ReplayError, match="different selectors"):
        merge_runs([one, other])


def test_a_run_that_cannot_start_is_a_one_line_error(archive: str) -> None:
    with pytest.raises(SelectorError, match="baseline 'native' is not one of the selectors"):
        run_replay(_config(archive, baseline="native"))
    with pytest.raises(SelectorError, match="no selectors given"):
        run_replay(ReplayConfig(locations=(archive,), selectors=(), device="cpu"))
    with pytest.raises(ArchiveError, match="the run has 3 cases"):
        run_replay(_config(archive, case_indices=(3,)))
