"""Call records: every indexer top-k call a capture saw, per forward pass, whether it was stored or not.

A stored case is one call; a serving forward makes dozens (one per layer, several widths in a chunked
prefill, one per decode step). To say what a selector changes per forward, `replay --per-forward` needs
how many calls of which shape one forward makes, and how long the forward took. Each writer records its
own in `calls/<writer id>` (a group whose attributes hold the record, written once, at the end of the
run), next to the case groups it owns, so ranks and runs sharing an archive never write the same node.
Archives without the group (synthetic suites, imports, older captures) have no call records, and say so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from logitreplay.archive.store import Archive, _child_names
from logitreplay.errors import ArchiveError, one_line

CALLS_GROUP = "calls"


@dataclass(frozen=True)
class CallCount:
    """`count` indexer calls of one shape within one forward: layer, width (cols), rows, the score
    dtype (None where the capture did not see the matrix), and `kind` (prefill or decode)."""

    layer: int
    width: int
    rows: int
    dtype: str | None
    kind: str
    count: int = 1


@dataclass
class Forward:
    """One forward pass (a prefill chunk, a decode step): its calls and, where the engine gives it, its
    wall time in microseconds."""

    calls: list[CallCount] = field(default_factory=list)
    wall_us: float | None = None

    @property
    def n_calls(self) -> int:
        return sum(c.count for c in self.calls)


@dataclass
class CallRecord:
    """The forwards one writer saw, and what measured their time (`timer`: e.g. "cuda-events")."""

    writer: str
    engine: str
    timer: str | None
    forwards: list[Forward] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CallRecord:
        return cls(str(d["writer"]), str(d["engine"]), d.get("timer"),
                   [Forward([CallCount(**c) for c in f["calls"]], f.get("wall_us")) for f in d["forwards"]])


def write_calls(archive: Archive, record: CallRecord) -> None:
    """Store one writer's record (its own group: never rewritten by another writer)."""
    if not archive.writable:
        raise ArchiveError(f"{archive.location}: opened read-only")
    group = archive._root.require_group(CALLS_GROUP).create_group(record.writer)
    group.attrs["record"] = record.to_json()


def read_calls(archive: Archive) -> list[CallRecord]:
    """Every writer's record, by writer id; empty when the archive has none. A malformed record is an
    `ArchiveError` naming it (the numbers built on it would be wrong, not merely missing)."""
    try:
        group = archive._root[CALLS_GROUP]
    except KeyError:
        return []
    records = []
    for name in _child_names(group):
        try:
            records.append(CallRecord.from_json(dict(group[name].attrs)["record"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ArchiveError(f"{archive.location}: call record {name}: malformed ({one_line(e)})") from None
    return records


__all__ = ["CALLS_GROUP", "CallCount", "CallRecord", "Forward", "read_calls", "write_calls"]
