"""Where replayed cases come from: archives (paths or URLs, pinned) and the built-in control suites,
streamed one case at a time; and the short source description tables show for a case."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from logitreplay.archive import ELEMENT_BYTES, Archive, Case, CaseInfo
from logitreplay.archive.ids import check_globs, matches, short_id
from logitreplay.datasets import controls as derived
from logitreplay.datasets import synth
from logitreplay.errors import ArchiveError


@dataclass(frozen=True)
class Unreadable:
    """A stored case that could not be read (damaged chunk, malformed attributes): it is reported as an
    invalid case with the archive's one-line error, and the other cases still replay."""

    case_id: str
    reason: str


def open_cases(locations: Sequence[str], suite: str | None, scale: str, start: int = 0,
               controls: Sequence[str] = (), case_globs: Sequence[str] = (), case_regex: str | None = None,
               only: Sequence[int] | None = None) -> tuple[Iterator[Case | Unreadable], int, list[str]]:
    """Cases to replay, how many, and the archives' pinned locations (a Hub URL resolved to its commit,
    for the record and for isolated children, which must read the very same data): every complete case
    of each archive (path or URL), then the built-in suite if one is named, skipping the first `start`
    without reading them (an isolated child resumes after a crash this way). Archives are opened (and
    so checked) before anything runs.

    A suite is regenerated case by case from its recipes rather than cached on disk: generation is
    bit-identical everywhere and costs less than writing and re-reading the ~3.5 GB full-scale suite
    (a fresh GPU machine would pay that write on every first run).

    `controls` (kinds of `datasets/controls.py`) follow each case with its derived cases, generated on
    the fly; they count as cases (an unreadable case's controls are unreadable too, so every case
    stands for the same number of entries and `start` keeps its meaning).

    `case_globs` / `case_regex` (`replay --case`, `--match`) keep only the cases whose id matches one of
    the globs and the regular expression, chosen by id before any case is read.

    `only` keeps the cases at these places of the whole run (0-based, after `case_globs` and
    `case_regex`, controls counted), e.g. one rank's share of a distributed replay: the count is then
    theirs, `start` counts within them, and the entries none of them stands for are never read."""
    entries, archives = _entries(locations, suite, scale, case_globs, case_regex)
    names = derived.derived_names(controls)
    per = 1 + len(names)  # every entry stands for itself and its derived cases

    def read(entry: tuple[Archive, CaseInfo] | synth.Recipe) -> Case | Unreadable:
        if isinstance(entry, synth.Recipe):
            return synth.generate(entry)
        archive, info = entry
        if not info.complete:
            return Unreadable(info.case_id, _incomplete_reason(info))
        try:
            return archive.read(info.case_id)
        except ArchiveError as e:
            return Unreadable(info.case_id, f"unreadable: {e}")

    places = range(len(entries) * per) if only is None else sorted(set(only))
    if places and not 0 <= places[0] <= places[-1] < len(entries) * per:
        raise ArchiveError(f"case places {places[0]}-{places[-1]}: the run has {len(entries) * per} cases")

    def stream() -> Iterator[Case | Unreadable]:
        for at, group in itertools.groupby(places[start:], key=lambda p: p // per):
            kept = {p % per for p in group}
            case = read(entries[at])
            every: Iterable[Case | Unreadable] = derived.with_controls(case, controls) if isinstance(case, Case) \
                else [case, *(Unreadable(derived.control_id(case.case_id, n), case.reason) for n in names)]
            yield from (c for i, c in enumerate(every) if i in kept)

    return stream(), len(places), [a.location for a in archives]


def _entries(locations: Sequence[str], suite: str | None, scale: str, case_globs: Sequence[str],
             case_regex: str | None) -> tuple[list[tuple[Archive, CaseInfo] | synth.Recipe], list[Archive]]:
    """The run's entries (stored cases, then the suite's recipes) in order, chosen by id, and the archives."""
    archives: list[Archive] = []
    for loc in locations:
        archive = Archive.open(loc)
        if archive.location not in [a.location for a in archives]:  # `replay A A` replays A once
            archives.append(archive)
    entries: list[tuple[Archive, CaseInfo] | synth.Recipe] = [(a, i) for a in archives for i in a.infos()]
    if suite is not None:
        entries += synth.recipes(suite, scale)
    _refuse_duplicate_ids(entries)
    if case_globs or case_regex is not None:
        entries = _select(entries, case_globs, case_regex)
    return entries, archives


@dataclass(frozen=True)
class EntryCost:
    """One entry of a run (a stored case or a recipe) with the derived controls that follow it: the ids of
    its places, in order, and the estimated cost of replaying them all."""

    ids: tuple[str, ...]
    cost: int


def case_costs(locations: Sequence[str], suite: str | None, scale: str, controls: Sequence[str] = (),
               case_globs: Sequence[str] = (), case_regex: str | None = None) -> tuple[list[EntryCost], list[str]]:
    """The entries `open_cases` would replay, in its order, and the archives' pinned locations, from the
    metadata alone (no case is read): how a distributed replay shares a run between its ranks. An
    entry's cost is the bytes its replay moves, per place: the padded matrix (rows x row stride), which
    verification rebuilds and every selector reads, and each row's top-k output; at least 1."""
    entries, archives = _entries(locations, suite, scale, case_globs, case_regex)
    names = derived.derived_names(controls)
    out = []
    for entry in entries:
        cid = _entry_id(entry)
        shape = entry[1].attrs if isinstance(entry, tuple) else {
            "rows": entry.rows, "row_stride": entry.row_stride or entry.cols, "top_k": entry.top_k, "dtype": entry.dtype}
        rows, stride, top_k = (shape.get(k) for k in ("rows", "row_stride", "top_k"))
        ints = all(type(v) is int and v >= 0 for v in (rows, stride, top_k))
        cost = rows * (stride * ELEMENT_BYTES.get(str(shape.get("dtype")), 4) + top_k * 4) if ints else 0  # type: ignore[operator]
        out.append(EntryCost((cid, *(derived.control_id(cid, n) for n in names)), (1 + len(names)) * max(1, cost)))
    return out, [a.location for a in archives]


def _incomplete_reason(info: CaseInfo) -> str:
    why = info.attrs.get("error") if isinstance(info.attrs.get("error"), str) else None
    return (f"unreadable: case {info.case_id}: {why}" if why else
            f"incomplete: case {info.case_id}: its writer did not finish; `logitreplay repair` completes or "
            "removes it")


def _entry_id(entry: tuple[Archive, CaseInfo] | synth.Recipe) -> str:
    return entry.case_id if isinstance(entry, synth.Recipe) else entry[1].case_id


def _entry_short_id(entry: tuple[Archive, CaseInfo] | synth.Recipe) -> str:
    if isinstance(entry, synth.Recipe):
        return short_id(entry.case_id, entry.cols, entry.rows, entry.top_k)
    return entry[1].short_id


def _select(entries: list[tuple[Archive, CaseInfo] | synth.Recipe], globs: Sequence[str],
            regex: str | None) -> list[tuple[Archive, CaseInfo] | synth.Recipe]:
    """The entries whose id matches one of `globs` (an exact id is a glob of itself) and `regex`
    (searched); a glob or a regular expression that matches no case is an error, not an empty run."""
    ids = [_entry_id(e) for e in entries]
    shorts = [_entry_short_id(e) for e in entries]
    check_globs(ids, globs, shorts)
    try:
        pattern = None if regex is None else re.compile(regex)
    except re.error as e:
        raise ArchiveError(f"--match {regex}: not a regular expression ({e})") from None
    kept = [e for e, cid, short in zip(entries, ids, shorts, strict=True)
            if matches(cid, globs, short) and (pattern is None or pattern.search(cid))]
    if not kept:
        raise ArchiveError(f"--match {regex}: matches none of the {len(ids)} case ids (with --case: "
                           f"{', '.join(globs) or '-'})")
    return kept


def _refuse_duplicate_ids(entries: Sequence[tuple[Archive, CaseInfo] | synth.Recipe]) -> None:
    """Results are keyed by case id, so one id from two sources would make a report ambiguous."""
    seen: dict[str, str] = {}
    for entry in entries:
        cid, where = ((entry.case_id, f"suite {entry.suite}") if isinstance(entry, synth.Recipe)
                      else (entry[1].case_id, entry[0].location))
        if cid in seen:
            raise ArchiveError(f"case {cid}: in both {seen[cid]} and {where}; replay them separately")
        seen[cid] = where


def describe_source(case: Case) -> str:
    """A short source for tables: the synthetic distribution, or model and layer of a capture; a decode
    case adds its batch, next_n and context span (`decode b64 n1 ctx 1K-128K`), which groups it."""
    a = case.attrs
    decode = case.decode.describe() if case.decode is not None else None
    if a.get("source") == "control":
        return f"{a.get('control')} control"
    if a.get("source") == "synthetic":
        recipe: dict[str, Any] = a["recipe"] if isinstance(a.get("recipe"), dict) else {}
        tags = [t for t, on in (("edge rows", "edges" in (recipe.get("ends"), recipe.get("seq_lens"))),
                                ("multi-request", recipe.get("starts") == "requests"),
                                (f"stride {recipe.get('row_stride')}", recipe.get("row_stride") is not None)) if on]
        return ", ".join([str(a.get("distribution", "synthetic")), *([decode] if decode else []), *tags])
    parts = []
    if a.get("model"):
        parts.append(str(a["model"]).rstrip("/").rsplit("/", 1)[-1])  # a local path or an org/name id
    if a.get("layer_index") is not None:
        parts.append(f"layer {a['layer_index']}")
    elif a.get("layer_name"):
        parts.append(str(a["layer_name"]))
    if decode:
        parts.append(decode)
    if not parts and a.get("imported_from"):  # a safetensors file from another tool (export.read_file)
        return f"imported {a['imported_from']}"
    return " ".join(parts) or str(a.get("source", "captured"))
