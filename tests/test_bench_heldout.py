"""bench/decisions.py's held-out split and bench/heldout.py's out-of-sample score of `auto`: the split names
real cases of each suite and stays out of the fit, and on the committed reports every unlabeled twin is
dispatched as its labelled case is."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from logitreplay.datasets import synth
from logitreplay.replay.results import read_json
from logitreplay.selectors.auto import DispatchRule

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> tuple[ModuleType, ModuleType]:
    sys.path.insert(0, str(ROOT / "bench"))
    import decisions
    import heldout

    return decisions, heldout


def test_the_held_out_cases_are_cases_of_their_suites_and_out_of_the_fit(bench: tuple[ModuleType, ModuleType]) -> None:
    decisions, heldout = bench
    assert set(decisions.HELD_OUT) == set(heldout.LONG_RUNS) == {*heldout.RUNS, "long", "long-decode"}
    assert "v32-indexer-c1048576-r128-k2048" not in decisions.HELD_OUT["long"]  # in the fit: HELD_OUT says why
    for suite, ids in decisions.HELD_OUT.items():
        assert set(ids) <= {r.case_id for r in synth.recipes(suite, "full")}, suite
    report = read_json(ROOT / "bench/results" / heldout.RUNS["indexer"][0])
    fitted, held = decisions.keep(report, held=False), decisions.keep(report, held=True)
    assert {c.case_id for c in held.cases} == set(decisions.HELD_OUT["indexer"])
    assert not {c.case_id for c in fitted.cases} & decisions.held_out_ids()
    assert len(fitted.cases) + len(held.cases) == len(report.cases)
    rule = DispatchRule.load(ROOT / "bench/results" / heldout.FOLDER / "rule.json")
    older = sum(len(decisions.HELD_OUT[s]) for s in heldout.RUNS)  # the long suites came after this fit
    assert rule.fitted_on["cases"] == 151 - older  # the committed rule saw none of them
    tree = DispatchRule.load(ROOT / "bench/results" / heldout.TREE_FOLDER / "rule.json")
    assert tree.fitted_on["cases"] == rule.fitted_on["cases"]  # the refit on the tree's timings neither
    for suite in ("stress", "indexer", "indexer-decode"):  # fitted on the tree's run, scored on the re-bet's
        assert heldout.TREE_RUNS[suite][0].startswith(heldout.TODAY)
        assert set(heldout.TREE_RUNS[suite]) == set(heldout.RUNS[suite])


def test_every_unlabeled_twin_is_dispatched_as_its_labelled_case(bench: tuple[ModuleType, ModuleType]) -> None:
    _, heldout = bench
    scored = heldout.score()
    assert len(scored) == 67  # 28 held-out cases, each in two runs, the 11 of stress and the indexer suites in three
    assert all(s.chosen["unlabeled"] == s.chosen["labelled"] for s in scored)
    decode = [s for s in scored if s.kind == "decode"]
    assert decode and any(s.chosen["unlabeled, label only"] != s.chosen["labelled"] for s in decode)



def test_a_refit_is_scored_beside_the_committed_rule_on_the_same_cases(bench: tuple[ModuleType, ModuleType]) -> None:
    decisions, heldout = bench
    import peers  # on the path the fixture set

    assert "bench/results/" + heldout.COMMITTED == peers.AUTO_RULE
    # the older tables score the suites of their own runs, though HELD_OUT now names the long suites too
    tree = heldout.score(folder=heldout.TREE_FOLDER, runs_of=heldout.TREE_RUNS)
    assert {s.suite for s in tree} == set(heldout.RUNS) and len(tree) == 67
    kept = heldout.score(folder=heldout.TREE_FOLDER, runs_of=heldout.TREE_RUNS, rule_file=heldout.COMMITTED)
    assert [(s.run, s.case_id) for s in kept] == [(s.run, s.case_id) for s in tree]
    assert any(a.chosen != b.chosen for a, b in zip(tree, kept, strict=True))  # two rules, not one read twice
    table = heldout.versus(folder=heldout.TREE_FOLDER, runs_of=heldout.TREE_RUNS)
    alone = heldout.table(folder=heldout.TREE_FOLDER, runs_of=heldout.TREE_RUNS)
    total = next(line for line in table if line.startswith("| all |")).split(" | ")
    assert total[2:4] == next(line for line in alone if line.startswith("| all |")).split(" | ")[2:4]
    # `ids` scores cases the fit saw, in every run of their suite
    seen = heldout.score(folder=heldout.TREE_FOLDER, runs_of={"indexer": heldout.TREE_RUNS["indexer"]},
                         ids={"v32-indexer-c32768-r2048-k2048"})
    assert [s.case_id for s in seen] == ["v32-indexer-c32768-r2048-k2048"] * 3



def test_the_long_refit_is_scored_on_both_runs_of_the_long_suites(bench: tuple[ModuleType, ModuleType]) -> None:
    decisions, heldout = bench
    refit = DispatchRule.load(ROOT / "bench/results" / heldout.LONG_FOLDER / "rule.json")
    assert refit.fitted_on["cases"] == 151 + 8 + 29 - len(decisions.held_out_ids())
    long = heldout.score(folder=heldout.LONG_FOLDER, runs_of=heldout.LONG_RUNS)
    held = len(decisions.HELD_OUT["long"]) + len(decisions.HELD_OUT["long-decode"])
    assert len(long) == 67 + 2 * held  # every long held-out case in the peers run and the second run
    assert {s.run for s in long if s.suite.startswith("long")} == {
        *heldout.LONG_RUNS["long"], *heldout.LONG_RUNS["long-decode"]}
    # the committed rule's documented long-suite miss, a case in the fit: deepselect where split is 1.48x faster
    miss = heldout.score(folder=heldout.LONG_FOLDER, runs_of={"long": heldout.LONG_RUNS["long"]},
                         rule_file=heldout.COMMITTED, ids={"v32-indexer-c1048576-r128-k2048"})
    assert [(s.chosen["labelled"], round(s.ratio["labelled"], 2)) for s in miss] == [("deepselect", 1.48)] * 2
