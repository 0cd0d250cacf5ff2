"""The report's shape is stated once: the result types and `report.schema.json` agree field for field,
and a report that does not match the schema is never written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from logitreplay.replay import results
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.results import CaseResult, ReplayResult, ReportError, SelectorResult
from logitreplay.replay.verify import Failure


def _keys(node: dict[str, Any]) -> set[str]:
    assert node.get("additionalProperties") is False and set(node["required"]) <= set(node["properties"])
    return set(node["properties"])


def _fields(cls: type) -> set[str]:
    return {f.name for f in results.report_fields(cls)}


def test_schema_and_types_agree_field_for_field() -> None:
    s = results.schema()
    defs = s["$defs"]
    assert _keys(s) == _fields(ReplayResult) | {"schema"}
    assert _keys(s["properties"]["protocol"]) == _fields(TimingProtocol)
    assert _keys(defs["case"]) == _fields(CaseResult)
    assert _keys(defs["result"]) == _fields(SelectorResult)
    assert _keys(defs["failure"]) == _fields(Failure)
    assert _keys(defs["timing"]) == set(Timing([1.0]).to_json())


def _report() -> ReplayResult:
    ok = SelectorResult("native", "ok", timing=Timing([2.0, 3.0, 4.0], "wall"))
    failed = SelectorResult("broken", "failed", "check 2 (count)", [Failure(2, "count", "c", 0, "x")])
    case = CaseResult("c", 4, 64, 8, "float32", 64, "normal", 1024, results=[ok, failed])
    return ReplayResult("cpu", "test", TimingProtocol(), {"python": "3", "torch": "2", "numpy": "1",
                                                          "platform": "p", "cpu": "c"},
                        "native", ["native", "broken"], [case])


def test_round_trip_through_the_file(tmp_path: Path) -> None:
    report = _report()
    results.write_json(report, tmp_path / "r.json")
    assert results.read_json(tmp_path / "r.json") == report


def test_a_report_that_breaks_the_schema_is_not_written(tmp_path: Path) -> None:
    report = _report()
    report.cases[0].results[0].status = "fine"  # not one of the statuses
    with pytest.raises(ReportError, match="cases/0/results/0/status"):
        results.write_json(report, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
