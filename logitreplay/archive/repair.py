"""`repair`: what to do with the incomplete cases a killed writer (capture, synth, import) left behind.

A case is marked `complete` only after its last array and its attributes are written. A writer killed
after that point but before the mark left a case whose every array is present and matches its recorded
sha256: repair marks it complete. Any other incomplete case (arrays missing or damaged, no attributes,
unparsable metadata, a symbolic link in place of its folder) is not data and is removed.

A complete case is read and verified too (every array's sha256, every invariant): one that fails is
damaged, and repair says so, case by case, and ends non-zero (cli/repair.py) rather than report a
healthy archive. It is left as it is unless asked (`remove_damaged`): a damaged case may still be
recovered from where it came from (a Hub copy, the capture's host), and removing data is the user's call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from logitreplay.archive.store import Archive, remove_case_folder
from logitreplay.errors import ArchiveError


@dataclass(frozen=True)
class Repair:
    """One incomplete case and what repair does (or, in a dry run, would do) with it."""

    case_id: str
    action: str  # "complete" | "remove" | "damaged" (a complete case that fails its checks, left as it is)
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"case_id": self.case_id, "action": self.action, "reason": self.reason}


def plan(archive: Archive, remove_damaged: bool = False) -> list[Repair]:
    """What `repair` would do, case by case: every case is read and verified (complete cases too, to find
    the damaged ones; `remove_damaged` removes them)."""
    out = []
    root = Path(archive.location)
    for info in archive.infos():
        if info.complete:
            try:
                archive.read(info.case_id)
            except ArchiveError as e:
                why = str(e).removeprefix(f"case {info.case_id}: ")
                out.append(Repair(info.case_id, "remove" if remove_damaged else "damaged", f"damaged: {why}"))
            continue
        if (root / "cases" / info.case_id).is_symlink():
            out.append(Repair(info.case_id, "remove", "a symbolic link in place of a case folder"))
            continue
        if isinstance(info.attrs.get("error"), str):
            out.append(Repair(info.case_id, "remove", info.attrs["error"]))
            continue
        try:
            archive.read_unmarked(info.case_id)
        except ArchiveError as e:
            out.append(Repair(info.case_id, "remove", f"its writer did not finish ({e})"))
            continue
        out.append(Repair(info.case_id, "complete", "every array present and matching its sha256"))
    return out


def repair(archive: Archive, dry_run: bool = False, remove_damaged: bool = False) -> list[Repair]:
    """Complete or remove every incomplete case, and find (or with `remove_damaged`, remove) the damaged
    complete ones (see the module docstring), holding the writer lock."""
    if not archive.writable:
        raise ArchiveError(f"{archive.location}: open the archive for writing to repair it")
    with archive.lock():
        steps = plan(archive, remove_damaged)
        if not dry_run:
            for step in steps:
                if step.action == "complete":
                    archive.mark_complete(step.case_id)
                elif step.action == "remove":
                    remove_case_folder(Path(archive.location), step.case_id)
    return steps
