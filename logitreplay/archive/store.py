"""The archive: a zarr v3 group `cases/<case_id>/...` of cases, on disk, in a zip, or behind any fsspec URL.

Every stage reads or writes archives through this module: capture writes `Case`s with `Archive.write`,
replay iterates an `Archive`. A case group is marked `complete` only after all of its arrays are
written, so a killed writer leaves an incomplete case that readers list as such and never read as data.

Its ~450 lines are one class on purpose: opening, listing, reading, writing and packing share the
store handle and the checks on hostile stores (`guards.py`), and a reader must see them together to
trust that no path reads a chunk before its metadata was bounded.
"""

from __future__ import annotations

import math
import os
import shutil
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from logitreplay.archive.case import CASE_ARRAYS, DTYPES, MAX_INDEX, STORAGE_DTYPE, Case, sha256_of
from logitreplay.archive.chunks import check_codecs
from logitreplay.archive.chunks import install as install_chunk_checks
from logitreplay.archive.guards import (
    LOCK_FILE,
    check_array,
    check_memory,
    guarded_local_store,
    inside,
    writer_lock,
)
from logitreplay.archive.ids import natural_order, short_id
from logitreplay.errors import ArchiveError, one_line

SCHEMA_VERSION = 1
# 4 Mi elements per chunk: big enough that per-chunk overhead vanishes, small enough to stream.
_CHUNK = 1 << 22
# The dtype each case array is stored as (values: by the case's dtype).
_INDEX_DTYPES: dict[str, np.dtype[Any]] = {"offsets": np.dtype("<i8"), "row_starts": np.dtype("<i4"), "row_ends": np.dtype("<i4"),
                 "reference_indices": np.dtype("<i4")}


@dataclass(frozen=True)
class CaseInfo:
    """What can be known about a stored case without reading its values."""

    case_id: str
    complete: bool
    attrs: dict[str, Any]
    stored_bytes: int | None  # bytes on disk of its chunks, when the store can list them

    @property
    def rows(self) -> int:
        return int(self.attrs.get("rows", 0))

    @property
    def short_id(self) -> str:
        """The id as the 80-column tables show it (`ids.short_id`), which `--case` takes too."""
        cols, rows, top_k = (self.attrs.get(k) for k in ("cols", "rows", "top_k"))
        if type(cols) is int and type(rows) is int and type(top_k) is int:
            return short_id(self.case_id, cols, rows, top_k)
        return self.case_id

    @property
    def provenance(self) -> dict[str, Any]:
        """The case's provenance attributes; empty when they are missing or not a JSON object."""
        prov = self.attrs.get("provenance")
        return prov if isinstance(prov, dict) else {}


def _codecs() -> list[Any]:
    # Measured by bench/codecs.py (bench/RESULTS.md): on normal float32 logits Blosc lz4+bitshuffle
    # compresses a little better than Zstd-1 (1.11x vs 1.08x) and decodes ~2x faster; Zstd-1 wins only on
    # rows of mostly exact zeros. Capture writes and replay reads at speed, so speed decides.
    # A CRC-32C of each compressed chunk follows it, checked before Blosc decodes a byte (chunks.py).
    from zarr.codecs import BloscCodec, Crc32cCodec

    install_chunk_checks()
    return [BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle"), Crc32cCodec()]


def chunk_shape(data: np.ndarray) -> tuple[int, ...]:
    """The chunks a case array is stored in: up to `_CHUNK` elements, whole rows of a 2-D array."""
    if data.ndim == 2:
        return (max(1, min(data.shape[0], _CHUNK // max(1, data.shape[1]))), data.shape[1])
    return (min(_CHUNK, max(1, data.shape[0])),) + data.shape[1:]


def write_array(group: Any, name: str, data: np.ndarray, shards: tuple[int, ...] | None = None) -> None:
    """Create the array `name` in a case group with the archive's chunks and codec, and fill it."""
    arr = group.create_array(name, shape=data.shape, dtype=data.dtype, chunks=chunk_shape(data), shards=shards,
                             compressors=_codecs(), fill_value=0)
    if data.size:
        arr[...] = data


class Archive:
    """A zarr v3 group `cases/<case_id>/...` of cases, opened for writing (directory) or reading (any URL).

    A case group is marked `complete` only after all of its arrays are written, so a writer killed
    half-way leaves an incomplete case that readers list as such and never read as data. Each writer owns
    the case groups it creates; shared (root) attributes are written once, at creation.
    """

    def __init__(self, group: Any, location: str, writable: bool) -> None:
        self._root = group
        self.location = location
        self.writable = writable
        meta = dict(group.attrs).get("logitreplay")
        if not isinstance(meta, dict) or "schema_version" not in meta:
            raise ArchiveError(f"{location}: not a logitreplay archive (no 'logitreplay' root attribute)")
        if meta["schema_version"] != SCHEMA_VERSION:
            raise ArchiveError(f"{location}: schema version {meta['schema_version']!r} is not supported "
                               f"(this logitreplay reads version {SCHEMA_VERSION})")
        self.attrs: dict[str, Any] = dict(group.attrs)

    # -- opening

    @classmethod
    def create(cls, path: str | os.PathLike[str], attrs: dict[str, Any] | None = None,
               exist_ok: bool = True) -> Archive:
        """Create (or, with `exist_ok`, reopen for appending) a directory archive."""
        import zarr

        install_chunk_checks()
        p = Path(path)
        if p.suffix == ".zip":
            raise ArchiveError(f"{p}: write to a directory archive, then `pack` it to a zip")
        if p.exists() and not p.is_dir():
            raise ArchiveError(f"{p}: exists and is not a directory")
        if p.exists() and (p / "zarr.json").exists():
            if not exist_ok:
                raise ArchiveError(f"{p}: archive exists")
            if not (p / "cases" / "zarr.json").exists():  # another process is creating it (TP ranks start
                with writer_lock(p, wait=True):            # together): its 'cases' group is there once it is done
                    pass
            return cls.open(p, mode="a")
        if p.exists() and any(e.name != LOCK_FILE for e in p.iterdir()):
            raise ArchiveError(f"{p}: exists and is not an archive; refusing to write into it")
        with writer_lock(p, wait=True):  # a second creator waits here, then appends to this archive
            if (p / "zarr.json").exists():
                return cls.open(p, mode="a")
            group = zarr.open_group(str(p), mode="a", zarr_format=3)
            group.attrs.update({"logitreplay": {"schema_version": SCHEMA_VERSION, "created": utc_now()},
                                **(attrs or {})})
            group.require_group("cases")
        return cls(group, str(p), True)

    @classmethod
    def open(cls, location: str | os.PathLike[str], mode: str = "r",
             storage_options: dict[str, Any] | None = None) -> Archive:
        """Open a directory, a `.zip`, or any fsspec URL (`hf://datasets/org/name/path`, `s3://...`)."""
        import zarr
        from zarr.storage import ZipStore

        install_chunk_checks()
        loc = os.fspath(location)
        is_url = "://" in loc
        prefix = ""  # the archive's folder inside a zip made with `zip -r f.zip f.zarr`
        try:
            if not is_url and loc.endswith(".zip"):
                if mode != "r":
                    raise ArchiveError(f"{loc}: zip archives are read-only")
                if not Path(loc).is_file():
                    raise ArchiveError(f"{loc}: no such file")
                prefix = _zip_prefix(loc)
                store: Any = ZipStore(loc, mode="r")
            elif is_url:
                if mode != "r":
                    raise ArchiveError(f"{loc}: remote archives are read-only")
                if loc.startswith("hf://"):
                    from logitreplay.archive.remote import pin_url

                    loc = pin_url(loc)  # read, and record in `location`, one commit, not a moving branch
                store = zarr.storage.FsspecStore.from_url(loc, storage_options=storage_options, read_only=True)
            else:
                if not Path(loc).exists():
                    raise ArchiveError(f"{loc}: no such file or directory")
                if not Path(loc).is_dir():
                    raise ArchiveError(f"{loc}: not a logitreplay archive (a file, not an archive directory, "
                                       ".zip or URL)")
                if not (Path(loc) / "zarr.json").is_file():
                    raise ArchiveError(f"{loc}: not a logitreplay archive (no zarr.json)")
                store = guarded_local_store(loc, read_only=(mode == "r"))
            # Consolidated metadata (`push` writes it for the Hub) lists every case in one request; only
            # remote copies use it: a case appended to a local copy would be missing from it.
            group = zarr.open_group(store, path=prefix, mode="r" if mode == "r" else "r+", zarr_format=3,
                                    use_consolidated=None if is_url else False)
        except ArchiveError:
            raise
        except (FileNotFoundError, KeyError) as e:
            raise ArchiveError(f"{loc}: not a logitreplay archive ({type(e).__name__}: {e})") from None
        except zipfile.BadZipFile as e:
            raise ArchiveError(f"{loc}: damaged zip ({e})") from None
        except ImportError as e:  # fsspec names the package a protocol needs (s3fs, gcsfs, ...)
            raise ArchiveError(f"{loc}: this kind of URL needs a package that is not installed "
                               f"({one_line(e)})") from None
        except Exception as e:  # zarr, numcodecs and fsspec raise many types for damaged metadata
            raise ArchiveError(f"{loc}: unreadable archive metadata ({type(e).__name__}: {one_line(e)})") from None
        return cls(group, loc, mode != "r")

    # -- listing

    def _cases_group(self) -> Any:
        import zarr

        try:
            cases = self._root["cases"]
        except KeyError:
            raise ArchiveError(f"{self.location}: archive has no 'cases' group") from None
        except Exception as e:
            raise ArchiveError(f"{self.location}: unreadable 'cases' group ({type(e).__name__}: "
                               f"{one_line(e)})") from None
        if not isinstance(cases, zarr.Group):
            raise ArchiveError(f"{self.location}: 'cases' is not a group")
        return cases

    def infos(self) -> list[CaseInfo]:
        """Every case group, complete or not, in natural id order (c1024, c6400, c12800: `ids.natural_key`),
        attributes only, no values read. A group whose metadata cannot be parsed is listed as incomplete,
        with the reason in its attributes."""
        import zarr

        cases = self._cases_group()
        out = []
        for name in natural_order(_child_names(cases)):
            try:
                node = cases[name]
                attrs = dict(node.attrs)
                if not isinstance(node, zarr.Group):
                    attrs = {"error": "not a case group (its metadata says array)"}
            except Exception as e:  # malformed zarr.json of one case must not hide the others
                attrs = {"error": f"unreadable metadata ({type(e).__name__}: {one_line(e)})"}
            out.append(CaseInfo(name, attrs.get("complete") is True, attrs, self._stored_bytes(name)))
        return out

    def case_ids(self) -> list[str]:
        """Ids of complete cases: the only ones that are data."""
        return [i.case_id for i in self.infos() if i.complete]

    def incomplete(self) -> list[str]:
        return [i.case_id for i in self.infos() if not i.complete]

    def __iter__(self) -> Iterator[Case]:
        """Stream complete cases one at a time (an archive larger than memory replays fine)."""
        for cid in self.case_ids():
            yield self.read(cid)

    def __len__(self) -> int:
        return len(self.case_ids())

    @property
    def _is_directory(self) -> bool:
        """A local directory archive (not a zip, not a URL): the only kind whose files can be listed."""
        return "://" not in self.location and not self.location.endswith(".zip")

    def _stored_bytes(self, case_id: str) -> int | None:
        if not self._is_directory:
            return None
        d = Path(self.location) / "cases" / case_id
        if d.is_symlink():
            return None
        return sum(f.lstat().st_size for f in d.rglob("*") if f.is_file())

    # -- reading

    def read(self, case_id: str) -> Case:
        """Read one complete case, verifying the sha256 of every array and every invariant of the format."""
        return self.read_unmarked(case_id, require_complete=True)

    def read_unmarked(self, case_id: str, require_complete: bool = False) -> Case:
        """`read`, but also a case whose writer stopped after its last array, before marking it complete
        (`repair` reads such a case to decide whether it can be completed)."""
        import zarr

        cases = self._cases_group()
        try:
            grp = cases[case_id]
            attrs = dict(grp.attrs)
        except KeyError:
            raise ArchiveError(f"case {case_id}: not in {self.location}") from None
        except Exception as e:  # malformed metadata: report, never guess
            raise ArchiveError(f"case {case_id}: unreadable metadata ({type(e).__name__}: {one_line(e)})") from None
        if not isinstance(grp, zarr.Group):
            raise ArchiveError(f"case {case_id}: not a case group (its metadata says array)")
        if require_complete and attrs.get("complete") is not True:
            raise ArchiveError(f"case {case_id}: incomplete (its writer did not finish); not data")
        if attrs.get("schema_version") != SCHEMA_VERSION:
            raise ArchiveError(f"case {case_id}: field schema_version: {attrs.get('schema_version')!r} "
                               f"is not supported (expected {SCHEMA_VERSION})")
        for key in ("top_k", "cols", "row_stride", "rows", "valid_elements"):
            if type(attrs.get(key)) is not int or attrs[key] < 0:
                raise ArchiveError(f"case {case_id}: field {key}: expected an integer, got {attrs.get(key)!r}")
        for key in ("checksums", "provenance"):
            if not isinstance(attrs.get(key), dict):
                raise ArchiveError(f"case {case_id}: field {key}: not a JSON object")
        dtype = attrs.get("dtype")
        if dtype not in DTYPES:
            raise ArchiveError(f"case {case_id}: field dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
        rows, top_k = attrs["rows"], attrs["top_k"]
        if not 1 <= top_k <= MAX_INDEX:
            raise ArchiveError(f"case {case_id}: field top_k: must be an integer in [1, 2^31), got {top_k}")
        shapes = {"values": (attrs["valid_elements"],), "offsets": (rows + 1,), "row_starts": (rows,),
                  "row_ends": (rows,), "reference_indices": (rows, top_k)}
        names = [n for n in CASE_ARRAYS if n != "reference_indices" or attrs.get("has_reference") is True]
        dtypes: dict[str, np.dtype[Any]] = {**_INDEX_DTYPES, "values": STORAGE_DTYPE[dtype]}
        # Every array's metadata must repeat the shapes the attributes claim, and what they take once
        # read must fit in memory: both checked before any chunk is read.
        stored = {n: _open_array(case_id, grp, n, dtypes[n], shapes[n]) for n in names}
        check_memory(f"case {case_id}", "its arrays", sum(math.prod(shapes[n]) * dtypes[n].itemsize for n in names))
        arrays = {n: _read_array(case_id, n, arr, attrs["checksums"]) for n, arr in stored.items()}
        case = Case(case_id, arrays["values"], arrays["offsets"], arrays["row_starts"], arrays["row_ends"],
                    attrs["top_k"], attrs["cols"], attrs["row_stride"], dtype,
                    arrays.get("reference_indices"), dict(attrs["provenance"]))
        case.validate()
        return case

    # -- writing

    def write(self, case: Case, overwrite: bool = False) -> None:
        """Write every array, then mark the case `complete` (the last, atomic step)."""
        if not self.writable:
            raise ArchiveError(f"{self.location}: opened read-only")
        from zarr.errors import ContainsArrayError, ContainsGroupError

        case.validate()
        cid = case.case_id
        if not cid or cid.startswith(".") or any(c in cid for c in "/\\\0"):
            raise ArchiveError(f"case {cid!r}: field case_id: must be a non-empty name without '/', '\\' or "
                               "a leading '.'")
        root = Path(self.location)
        inside(root, root / "cases" / cid)  # never write (or delete) through a symbolic link
        cases = self._cases_group()
        if cid in cases:
            if not overwrite:
                raise ArchiveError(f"case {cid}: already in {self.location}")
            del cases[cid]
        try:
            grp = cases.create_group(cid)
        except (ContainsGroupError, ContainsArrayError):
            raise ArchiveError(f"case {cid}: already in {self.location} (written by another process)") from None
        checksums = {}
        for name in CASE_ARRAYS:
            data = getattr(case, name)
            if data is None:
                continue
            write_array(grp, name, data)
            checksums[name] = sha256_of(data)
        grp.attrs.update({
            "schema_version": SCHEMA_VERSION,
            "rows": case.rows,
            "cols": case.cols,
            "top_k": case.top_k,
            "row_stride": case.row_stride,
            "dtype": case.dtype,
            "valid_elements": int(case.values.shape[0]),
            "has_reference": case.reference_indices is not None,
            "sha256": checksums["values"],
            "checksums": checksums,
            "created": utc_now(),
            "provenance": case.attrs,
        })
        grp.attrs["complete"] = True

    def pack(self, zip_path: str | os.PathLike[str]) -> Path:
        """Pack a finished directory archive into a zip (stored, not recompressed: chunks already are).

        Written to a temporary name and renamed, so a killed packer never leaves a half zip under the
        final name.
        """
        if not self._is_directory:
            raise ArchiveError(f"{self.location}: only a local directory archive can be packed")
        dst = Path(zip_path)
        tmp = dst.with_name(dst.name + ".partial")
        src = Path(self.location)
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
            for f in sorted(src.rglob("*")):
                if f.is_file() and f.name != LOCK_FILE:
                    zf.write(f, f.relative_to(src).as_posix())
        os.replace(tmp, dst)
        return dst

    def remove_incomplete(self) -> list[str]:
        """Delete case groups a killed writer left behind (only in a writable directory archive)."""
        if not self.writable:
            raise ArchiveError(f"{self.location}: opened read-only")
        gone = self.incomplete()
        for cid in gone:
            remove_case_folder(Path(self.location), cid)
        return gone

    def mark_complete(self, case_id: str) -> None:
        """Set `complete` on a case `read_unmarked` read in full (the last step its writer missed)."""
        root = Path(self.location)
        inside(root, root / "cases" / case_id)
        self._cases_group()[case_id].attrs["complete"] = True

    def lock(self) -> Any:
        """The archive's writer lock (a context manager): a second writer fails at once with one line."""
        if not self.writable or not self._is_directory:
            raise ArchiveError(f"{self.location}: only a writable directory archive can be locked")
        return writer_lock(Path(self.location))


def remove_case_folder(root: Path, case_id: str) -> None:
    """Delete `cases/<case_id>`; a symbolic link there is removed itself, never what it points to."""
    path = root / "cases" / case_id
    inside(root, root / "cases")
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def _zip_prefix(path: str) -> str:
    """Where the archive sits inside a zip: "" when its zarr.json is at the top (`pack`, or `cd f.zarr &&
    zip -r ../f.zip .`), else the one top-level folder holding it (`zip -r f.zip f.zarr`, the natural way)."""
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
    if "zarr.json" in names:
        return ""
    tops = {n.split("/", 1)[0] for n in names if "/" in n}
    if len(tops) == 1 and f"{next(iter(tops))}/zarr.json" in names:
        return next(iter(tops))
    return ""


def _open_array(case_id: str, grp: Any, name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> Any:
    """The zarr array `name` of a case, its metadata checked (`guards.check_array`); nothing read yet."""
    where = f"case {case_id}: field {name}"
    try:
        arr = grp[name]
    except KeyError:
        raise ArchiveError(f"{where}: array missing") from None
    except Exception as e:  # unparsable metadata, an unknown codec, a node type that lies
        raise ArchiveError(f"{where}: unreadable array metadata ({type(e).__name__}: {one_line(e)})") from None
    check_array(where, arr, dtype, shape)
    check_codecs(where, arr)
    return arr


def _read_array(case_id: str, name: str, arr: Any, checksums: dict[str, Any]) -> np.ndarray:
    """The data of a checked array, verified against its recorded sha256."""
    try:
        data = np.asarray(arr[...])
    except ArchiveError as e:  # chunks.CheckedBlosc refused it, or guards.py refused its file
        raise ArchiveError(f"case {case_id}: field {name}: {e}") from None
    except Exception as e:  # a damaged chunk fails inside the codec with any exception type
        why = ("a chunk's CRC-32C does not match (damaged chunk; refused before decompression)"
               if "checksum do not match" in str(e) else f"chunk unreadable ({type(e).__name__}: {one_line(e)})")
        raise ArchiveError(f"case {case_id}: field {name}: checksum error: {why}") from None
    want = checksums.get(name)
    if want is None:
        raise ArchiveError(f"case {case_id}: field {name}: no checksum recorded")
    if sha256_of(data) != want:
        raise ArchiveError(f"case {case_id}: field {name}: checksum error: sha256 mismatch "
                           "(damaged or missing chunk)")
    return data


def _child_names(group: Any) -> list[str]:
    """Names under a group, listed from the store itself: zarr's own listing parses every child's
    metadata, so one malformed case would hide all the others."""
    from zarr.core.sync import sync

    prefix = f"{group.path}/" if group.path else ""

    async def collect() -> list[str]:
        return [name async for name in group.store.list_dir(prefix)]

    return sorted(n.rstrip("/") for n in sync(collect()) if n != "zarr.json")


def utc_now() -> str:
    """The current UTC time, as every timestamp in an archive is written (`2026-01-31T12:00:00Z`)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
