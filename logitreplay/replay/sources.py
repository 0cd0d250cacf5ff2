"""Where replayed cases come from: archives (paths or URLs, pinned) and the built-in control suites,
streamed one case at a time; and the short source description tables show for a case."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from logitreplay.archive import Archive, Case
from logitreplay.datasets import synth
from logitreplay.errors import ArchiveError


@dataclass(frozen=True)
class Unreadable:
    """A stored case that could not be read (damaged chunk, malformed attributes): it is reported as an
    invalid case with the archive's one-line error, and the other cases still replay."""

    case_id: str
    reason: str


def open_cases(locations: Sequence[str], suite: str | None, scale: str,
               start: int = 0) -> tuple[Iterator[Case | Unreadable], int, list[str]]:
    """Cases to replay, how many, and the archives' pinned locations (a Hub URL resolved to its commit,
    for the record and for isolated children, which must read the very same data): every complete case
    of each archive (path or URL), then the built-in suite if one is named, skipping the first `start`
    without reading them (an isolated child resumes after a crash this way). Archives are opened (and
    so checked) before anything runs.

    A suite is regenerated case by case from its recipes rather than cached on disk: generation is
    bit-identical everywhere and costs less than writing and re-reading the ~3.5 GB full-scale suite
    (a fresh GPU machine would pay that write on every first run)."""
    archives = [Archive.open(loc) for loc in locations]
    entries: list[tuple[Archive, str] | synth.Recipe] = [(a, cid) for a in archives for cid in a.case_ids()]
    if suite is not None:
        entries += synth.recipes(suite, scale)

    def stream() -> Iterator[Case | Unreadable]:
        for entry in entries[start:]:
            if isinstance(entry, synth.Recipe):
                yield synth.generate(entry)
                continue
            archive, case_id = entry
            try:
                yield archive.read(case_id)
            except ArchiveError as e:
                yield Unreadable(case_id, f"unreadable: {e}")

    return stream(), len(entries), [a.location for a in archives]


def describe_source(case: Case) -> str:
    """A short source for tables: the synthetic distribution, or model and layer of a capture; a decode
    case adds its batch, next_n and context span (`decode b64 n1 ctx 1K-128K`), which groups it."""
    a = case.attrs
    decode = case.decode.describe() if case.decode is not None else None
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
    return " ".join(parts) or str(a.get("source", "captured"))
