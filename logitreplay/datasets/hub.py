"""Sharing archives through the Hugging Face Hub: push, pull, and pinned `hf://` URLs for streaming.

A pushed dataset repo *is* an archive (its root `zarr.json`, `cases/`), next to the card (`README.md`),
repacked with zarr sharding: every array becomes one shard file (or a few, for arrays over `MAX_SHARD_BYTES`), so a case costs
about a dozen files whatever its chunk count, and the repo stays inside the Hub's recommended limits
(fewer than 100k files per repo, 10k entries per folder, files under 20 GB). Its metadata is also
consolidated into the root `zarr.json`, so listing the cases remotely is one request, not one per case
(which the Hub's request rate limits would feel on a large dataset). It stays a plain zarr archive, so
`Archive.open("hf://datasets/org/name")` reads it in place: listing and attributes first, then only
the byte ranges of the cases actually read.

Every Hub location we record is pinned: `archive.remote.pin_url` resolves a branch or tag to its commit sha, so a report
or a pulled copy names the exact bytes it used even after the repo moves on.
"""

from __future__ import annotations

import glob
import json
import math
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from logitreplay.archive import CASE_ARRAYS, Archive, chunk_shape, write_array
from logitreplay.archive.guards import LOCK_FILE
from logitreplay.archive.remote import hub_errors, pin_url, resolve_revision
from logitreplay.datasets.card import build_card
from logitreplay.errors import ArchiveError, one_line

# The Hub's repository recommendations: fewer than 100k files per repo and 10k entries per folder, files
# under 20 GB (older guidance said 5 GB, hence the 4 GiB shard cap).
HUB_MAX_FILES = 100_000
HUB_MAX_FOLDER_ENTRIES = 10_000
MAX_SHARD_BYTES = 4 << 30


# ------------------------------------------------------------------------------------ references


def parse_ref(ref: str, revision_allowed: bool = True) -> tuple[str, str | None]:
    """`org/name[@revision]` -> (repo_id, revision or None), checked by the Hub client's own rules."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    repo_id, _, revision = ref.partition("@")
    try:
        validate_repo_id(repo_id)
        valid = repo_id.count("/") == 1
    except HFValidationError:
        valid = False
    if not valid:
        raise ArchiveError(f"{ref}: expected a dataset repo id ORG/NAME" + (", optionally @REVISION"
                                                                             if revision_allowed else ""))
    if revision and not revision_allowed:
        raise ArchiveError(f"{ref}: expected ORG/NAME without @REVISION (a push goes to the main branch)")
    return repo_id, revision or None


# --------------------------------------------------------------------------------------- staging


@dataclass(frozen=True)
class Staged:
    """What `stage` wrote: the folder `upload_folder` sends, and the numbers the Hub's limits apply to."""

    path: Path
    cases: list[str]
    skipped_incomplete: list[str]
    files: int
    largest_folder: tuple[str, int]
    bytes: int

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "cases": self.cases, "skipped_incomplete": self.skipped_incomplete,
                "files": self.files, "largest_folder": {"path": self.largest_folder[0],
                                                        "entries": self.largest_folder[1]},
                "bytes": self.bytes}


def _shards(data: np.ndarray) -> tuple[int, ...] | None:
    """Shards holding as many of the archive's chunks as fit `MAX_SHARD_BYTES` (None for an empty array)."""
    if data.size == 0:
        return None
    chunks = chunk_shape(data)
    chunk_bytes = math.prod(chunks) * data.itemsize
    per_shard = max(1, min(math.ceil(data.shape[0] / chunks[0]), MAX_SHARD_BYTES // chunk_bytes))
    return (chunks[0] * per_shard,) + chunks[1:]


def _copy_case(archive: Archive, case_id: str, attrs: dict[str, Any], cases_group: Any) -> None:
    """Rewrite one case into a sharded group: arrays first, its attributes (checksums and provenance
    untouched), then `complete` last, exactly as the archive's own writer orders it."""
    case = archive.read(case_id)  # verifies every checksum: a damaged case is never published
    grp = cases_group.create_group(case_id)
    for name in CASE_ARRAYS:
        data = getattr(case, name)
        if data is not None:
            write_array(grp, name, data, _shards(data))
    grp.attrs.update({k: v for k, v in attrs.items() if k != "complete"})
    grp.attrs["complete"] = True


def _count(folder: Path) -> tuple[int, tuple[str, int], int]:
    files, size, largest = 0, 0, (".", 0)
    for d in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        entries = list(d.iterdir())
        if len(entries) > largest[1]:
            largest = (d.relative_to(folder).as_posix(), len(entries))
        for e in entries:
            if e.is_file():
                files += 1
                size += e.stat().st_size
    return files, largest, size


def _beyond_limits(archive: Archive, cases: int, files: int, largest: tuple[str, int]) -> ArchiveError | None:
    if files < HUB_MAX_FILES and largest[1] < HUB_MAX_FOLDER_ENTRIES:
        return None
    return ArchiveError(f"{archive.location}: {cases} cases make {files} files ({largest[1]} entries in "
                        f"{largest[0]}), beyond the Hub's limits ({HUB_MAX_FILES} files, "
                        f"{HUB_MAX_FOLDER_ENTRIES} per folder); split the archive")


def stage(archive: Archive, repo_id: str, dest: Path | None = None, license: str = "cc-by-4.0") -> Staged:
    """Write the exact folder a push uploads: the card and the sharded archive, within the Hub's limits.

    `dest` must be empty or absent; None stages into a new temporary folder. A folder this call created
    is removed again if staging fails, so a failed push leaves nothing behind.
    """
    import zarr

    if dest is not None and dest.exists() and any(dest.iterdir()):
        raise ArchiveError(f"{dest}: staging folder exists and is not empty")
    infos = archive.infos()
    complete = [i for i in infos if i.complete]
    if not complete:
        raise ArchiveError(f"{archive.location}: no complete cases to push")
    # The one count known before writing anything: `cases/` holds one folder per case and its zarr.json.
    early = _beyond_limits(archive, len(complete), 0, ("cases", len(complete) + 1))
    if early is not None:
        raise early
    created = dest is None or not dest.exists()
    dest = Path(tempfile.mkdtemp(prefix="logitreplay-push-")) if dest is None else dest.resolve()
    try:
        root = zarr.open_group(str(dest), mode="w-", zarr_format=3)
        root.attrs.update(archive.attrs)
        cases_group = root.require_group("cases")
        for info in complete:
            _copy_case(archive, info.case_id, info.attrs, cases_group)
        with warnings.catch_warnings():  # zarr notes that v3 has no spec for it yet; zarr reads it fine
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            zarr.consolidate_metadata(str(dest))
        build_card(Archive.open(dest), repo_id, license=license).save(dest / "README.md")
        files, largest, size = _count(dest)
        error = _beyond_limits(archive, len(complete), files, largest)
        if error is not None:
            raise error
    except BaseException:
        if created:
            shutil.rmtree(dest, ignore_errors=True)
        raise
    return Staged(dest, [i.case_id for i in complete], [i.case_id for i in infos if not i.complete],
                  files, largest, size)


# ------------------------------------------------------------------------------------ push / pull


@dataclass(frozen=True)
class Pushed:
    repo_id: str
    commit: str
    url: str  # the pinned hf:// URL of the archive, what `replay` and `inspect` take

    def to_json(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "commit": self.commit, "url": self.url}


def hf_url(repo_id: str, sha: str) -> str:
    return f"hf://datasets/{repo_id}@{sha}"


def push(staged: Staged, repo_id: str, private: bool = False, token: str | None = None) -> Pushed:
    """Create the dataset repo if needed and upload the staged folder as one logical update.

    Files under `cases/` that the new archive no longer has are deleted in the same upload, so the repo
    mirrors the archive; history keeps every earlier commit.
    """
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    with hub_errors(f"dataset {repo_id}"):
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=staged.path,
                                 commit_message=f"logitreplay push: {len(staged.cases)} cases",
                                 delete_patterns=["cases/**"])
    return Pushed(repo_id, info.oid, hf_url(repo_id, info.oid))


@dataclass(frozen=True)
class Pulled:
    repo_id: str
    revision: str
    commit: str
    path: Path

    def to_json(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "revision": self.revision, "commit": self.commit,
                "path": str(self.path)}


SOURCE_FILE = ".logitreplay-source.json"
# Names a pulled repo may not hold: the client's bookkeeping and ours live under these in the target.
_RESERVED = (".cache", SOURCE_FILE, LOCK_FILE)


def safe_repo_name(name: object) -> bool:
    """Whether a file name a Hub server listed can be written under the target: a relative path of
    plain components (no '..', no backslash, no control character), outside the reserved names."""
    if not isinstance(name, str) or not name or len(name) > 1000 or name.startswith("/"):
        return False
    parts = name.split("/")
    return (all(p not in ("", ".", "..") and not any(c == "\\" or ord(c) < 32 for c in p) for p in parts)
            and parts[0] not in _RESERVED)


def _listed_names(repo_id: str, sha: str, what: str, token: str | None) -> list[str]:
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile

    entries = HfApi(token=token).list_repo_tree(repo_id, repo_type="dataset", revision=sha, recursive=True)
    names = [e.path for e in entries if isinstance(e, RepoFile)]
    bad = next((n for n in names if not safe_repo_name(n)), None)
    if bad is not None:
        raise ArchiveError(f"{what}: refused: the Hub listed the file name {str(bad)[:80]!r}, which would be "
                           "written outside the archive or over its bookkeeping")
    return names


def pull(ref: str, out: Path | None = None, include: tuple[str, ...] = (), token: str | None = None) -> Pulled:
    """Download a dataset repo (or the cases matching `include`) at a pinned commit into `out`.

    Everything, the client's bookkeeping included, is written under `out`: the download caches are pointed
    inside it, and file names that would escape it are refused by the client. `out` must be empty, absent,
    or an earlier (maybe interrupted) pull of the same repo, so a pull never overwrites unrelated files.
    `include` patterns always keep the archive's root metadata, so a partial pull still opens as an archive.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.utils import filter_repo_objects

    repo_id, revision = parse_ref(ref)
    target = (out if out is not None else Path("datasets") / "downloads" / repo_id).resolve()
    source = target / SOURCE_FILE
    if target.exists() and any(target.iterdir()):
        try:
            prior = json.loads(source.read_text()).get("repo_id")
        except (OSError, ValueError, AttributeError):
            prior = None
        if prior != repo_id:
            raise ArchiveError(f"{target}: not empty and not a pull of {repo_id}; choose another --out")
    sha = resolve_revision(repo_id, revision, token=token)
    patterns = None
    if include:
        patterns = [*include, "README.md", "zarr.json", "cases/zarr.json"]
    # Xet-backed files go through hf_xet, which keeps its own cache (by default under HF_HOME); a process
    # that has not started its xet session yet takes this location, unless the user chose one.
    os.environ.setdefault("HF_XET_CACHE", str(target / ".cache" / "huggingface" / "xet"))
    pulled = Pulled(repo_id, revision or "main", sha, target)
    record = {**pulled.to_json(), "url": hf_url(repo_id, sha)}
    target.mkdir(parents=True, exist_ok=True)
    source.write_text(json.dumps({**record, "complete": False}, indent=1) + "\n")  # lets a rerun resume
    what = f"dataset {repo_id}@{revision or 'main'}"
    with hub_errors(what):
        # Every name the server lists is checked before any path is made from it; the download then asks
        # for exactly those names, so a different answer the second time adds nothing.
        names = filter_repo_objects(_listed_names(repo_id, sha, what, token), allow_patterns=patterns)
        try:
            snapshot_download(repo_id, repo_type="dataset", revision=sha, local_dir=target,
                              cache_dir=target / ".cache" / "huggingface" / "hub",
                              allow_patterns=[glob.escape(n) for n in names], token=token)
        except ValueError as e:  # the client refuses file names that would land outside `target`
            raise ArchiveError(f"{what}: refused: {one_line(e)}") from None
    source.write_text(json.dumps({**record, "complete": True}, indent=1) + "\n")
    return pulled


__all__ = ["Pulled", "Pushed", "Staged", "hub_errors", "parse_ref", "pin_url", "pull", "push",
           "resolve_revision", "stage"]
