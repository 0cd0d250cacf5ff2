"""The shared data model: a *case* (one top-k selection problem exactly as a kernel saw it) and the
zarr v3 *archive* that stores many of them.

Every stage reads or writes this module and nothing else of the others: capture produces `Case`s and
writes them with `Archive.write`, replay iterates `Archive` and rebuilds kernel inputs with
`Case.padded`. Only the in-range part of each row is data (vLLM leaves the rest of the logits buffer
uninitialized), so values are stored ragged; `padded` rebuilds the source matrix with the recorded
row stride and poisons everything outside the bounds, so an out-of-bounds read is caught by verification.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

SCHEMA_VERSION = 1
DTYPES = ("float32", "bfloat16")
# What each logical dtype is stored as: numpy has no bfloat16, so its raw bits are kept as uint16.
_STORAGE_DTYPE: dict[str, np.dtype[Any]] = {"float32": np.dtype("<f4"), "bfloat16": np.dtype("<u2")}
_TORCH_DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# Bytes of one logit of each logical dtype, as a kernel reads it.
ELEMENT_BYTES = {name: dt.itemsize for name, dt in _STORAGE_DTYPE.items()}
CASE_ARRAYS = ("values", "offsets", "row_starts", "row_ends", "reference_indices")
# 4 Mi elements per chunk: big enough that per-chunk overhead vanishes, small enough to stream.
_CHUNK = 1 << 22
_MAX_INDEX = 2**31 - 1


class ArchiveError(ValueError):
    """A one-line, user-facing error about an archive or a case (names the case and the field)."""


@dataclass
class Case:
    """One selection problem: row r selects the `top_k` largest of `logits[r, row_starts[r]:row_ends[r]]`.

    `values` holds the in-range logits of every row concatenated (float32, or bfloat16 as raw uint16
    bits); row r is `values[offsets[r]:offsets[r + 1]]`. `attrs` is the JSON provenance (model and
    revision, engine, layer, chunk facts, synthetic recipe, ...).
    """

    case_id: str
    values: np.ndarray
    offsets: np.ndarray
    row_starts: np.ndarray
    row_ends: np.ndarray
    top_k: int
    cols: int
    row_stride: int
    dtype: str = "float32"
    reference_indices: np.ndarray | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.row_starts.shape[0])

    @property
    def lengths(self) -> np.ndarray:
        return (self.row_ends.astype(np.int64) - self.row_starts.astype(np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of valid logits: what a selector must read at least once."""
        return int(self.values.nbytes)

    @classmethod
    def from_rows(
        cls,
        case_id: str,
        values: np.ndarray | torch.Tensor,
        row_starts: np.ndarray | torch.Tensor,
        row_ends: np.ndarray | torch.Tensor,
        *,
        top_k: int,
        cols: int,
        row_stride: int | None = None,
        reference_indices: np.ndarray | torch.Tensor | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Case:
        """Build a case from already-ragged values (as capture stages them); offsets are derived."""
        v = _to_numpy(values)
        dtype = _logical_dtype(values)
        starts = _to_numpy(row_starts).astype(np.int32)
        ends = _to_numpy(row_ends).astype(np.int32)
        offsets = np.zeros(starts.shape[0] + 1, dtype=np.int64)
        np.cumsum(ends.astype(np.int64) - starts.astype(np.int64), out=offsets[1:])
        ref = None if reference_indices is None else _to_numpy(reference_indices).astype(np.int32)
        case = cls(case_id, v.reshape(-1), offsets, starts, ends, int(top_k), int(cols),
                   int(row_stride if row_stride is not None else cols), dtype, ref, dict(attrs or {}))
        case.validate()
        return case

    @classmethod
    def from_matrix(
        cls,
        case_id: str,
        logits: np.ndarray | torch.Tensor,
        row_starts: np.ndarray | torch.Tensor,
        row_ends: np.ndarray | torch.Tensor,
        *,
        top_k: int,
        row_stride: int | None = None,
        reference_indices: np.ndarray | torch.Tensor | None = None,
        attrs: dict[str, Any] | None = None,
    ) -> Case:
        """Keep only the in-range cells of a (rows, cols) matrix; the rest is not data."""
        t = logits if isinstance(logits, torch.Tensor) else _numpy_to_torch(np.asarray(logits))
        if t.dim() != 2:
            raise ArchiveError(f"case {case_id}: field logits: expected a 2-D matrix, got shape {tuple(t.shape)}")
        starts = torch.as_tensor(_to_numpy(row_starts), dtype=torch.int64)
        ends = torch.as_tensor(_to_numpy(row_ends), dtype=torch.int64)
        _check_bounds(case_id, starts.numpy(), ends.numpy(), t.shape[1])
        values = gather_rows(t.detach().cpu(), starts, ends)
        stride = row_stride if row_stride is not None else (t.stride(0) if t.shape[0] > 1 else t.shape[1])
        return cls.from_rows(case_id, values, starts, ends, top_k=top_k, cols=t.shape[1], row_stride=stride,
                             reference_indices=reference_indices, attrs=attrs)

    def validate(self) -> None:
        """Raise `ArchiveError` naming the case and field unless every invariant of the format holds."""
        cid = self.case_id

        def bad(fieldname: str, why: str) -> ArchiveError:
            return ArchiveError(f"case {cid}: field {fieldname}: {why}")

        if self.dtype not in DTYPES:
            raise bad("dtype", f"{self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.values.dtype != _STORAGE_DTYPE[self.dtype] or self.values.ndim != 1:
            raise bad("values", f"expected 1-D {_STORAGE_DTYPE[self.dtype]} for dtype {self.dtype}, "
                                f"got {self.values.ndim}-D {self.values.dtype}")
        if not isinstance(self.top_k, int) or self.top_k < 1 or self.top_k > _MAX_INDEX:
            raise bad("top_k", f"must be an integer in [1, 2^31), got {self.top_k!r}")
        if self.cols < 0 or self.cols > _MAX_INDEX:
            raise bad("cols", f"must be in [0, 2^31), got {self.cols}")
        if self.row_stride < self.cols or self.row_stride > _MAX_INDEX:
            raise bad("row_stride", f"must be in [cols={self.cols}, 2^31), got {self.row_stride}")
        for name in ("row_starts", "row_ends"):
            arr = getattr(self, name)
            if arr.dtype != np.int32 or arr.ndim != 1:
                raise bad(name, f"expected 1-D int32, got {arr.ndim}-D {arr.dtype}")
        if self.row_ends.shape != self.row_starts.shape:
            raise bad("row_ends", f"has {self.row_ends.shape[0]} rows, row_starts has {self.row_starts.shape[0]}")
        _check_bounds(cid, self.row_starts, self.row_ends, self.cols)
        if self.offsets.dtype != np.int64 or self.offsets.shape != (self.rows + 1,):
            raise bad("offsets", f"expected int64 of shape ({self.rows + 1},), got {self.offsets.dtype} "
                                 f"{self.offsets.shape}")
        if self.offsets[0] != 0 or not np.array_equal(np.diff(self.offsets), self.lengths):
            r = int(np.argmax(np.diff(self.offsets) != self.lengths)) if self.rows else 0
            raise bad("offsets", f"inconsistent with row bounds (first at row {r})")
        if self.values.shape[0] != self.offsets[-1]:
            raise bad("values", f"holds {self.values.shape[0]} elements, offsets say {int(self.offsets[-1])}")
        if self.reference_indices is not None:
            ref = self.reference_indices
            if ref.dtype != np.int32 or ref.shape != (self.rows, self.top_k):
                raise bad("reference_indices", f"expected int32 ({self.rows}, {self.top_k}), "
                                               f"got {ref.dtype} {ref.shape}")
        try:
            json.dumps(self.attrs, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise bad("attrs", f"not a JSON object: {e}") from None

    def torch_values(self) -> torch.Tensor:
        """The ragged values as a torch tensor of the logical dtype (zero-copy)."""
        return _numpy_to_torch(self.values, self.dtype)

    def row(self, r: int) -> torch.Tensor:
        return self.torch_values()[int(self.offsets[r]):int(self.offsets[r + 1])]

    def sha256(self) -> str:
        return _sha256(self.values)

    def padded(
        self,
        row_stride: int | None = None,
        poison: float = 1e30,
        device: str | torch.device = "cpu",
    ) -> torch.Tensor:
        """The (rows, cols) logits matrix as the kernel saw it: a view with stride(0) == row_stride.

        Cells outside `[start, end)` hold `poison` (a huge finite by default, NaN on request), so a
        selector that reads out of bounds returns values the reference never selects.
        """
        stride = self.row_stride if row_stride is None else int(row_stride)
        if stride < self.cols:
            raise ArchiveError(f"case {self.case_id}: field row_stride: {stride} < cols {self.cols}")
        storage = torch.full((max(self.rows, 1) * stride,), poison, dtype=_TORCH_DTYPE[self.dtype], device=device)
        if self.values.size:
            dev = storage.device
            lengths = torch.from_numpy(self.lengths).to(dev)
            rows = torch.repeat_interleave(torch.arange(self.rows, device=dev), lengths)
            offsets = torch.from_numpy(self.offsets).to(dev)
            starts = torch.from_numpy(self.row_starts.astype(np.int64)).to(dev)
            pos = torch.arange(self.values.shape[0], device=dev) - offsets[rows] + starts[rows]
            storage[rows * stride + pos] = self.torch_values().to(dev)
        return storage.as_strided((self.rows, self.cols), (stride, 1))


def gather_rows(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Concatenate `logits[r, starts[r]:ends[r]]` over rows without a Python loop (any device)."""
    dev = logits.device
    starts = starts.to(dev, torch.int64)
    lengths = ends.to(dev, torch.int64) - starts
    total = int(lengths.sum())
    if total == 0:
        return logits.new_empty((0,))
    rows = torch.repeat_interleave(torch.arange(logits.shape[0], device=dev), lengths)
    first = torch.cumsum(lengths, 0) - lengths
    cols = torch.arange(total, device=dev) - first[rows] + starts[rows]
    return logits[rows, cols]


def _check_bounds(cid: str, starts: np.ndarray, ends: np.ndarray, cols: int) -> None:
    for name, cond in (("row_starts", starts < 0), ("row_ends", ends < starts), ("row_ends", ends > cols)):
        if cond.any():
            r = int(np.argmax(cond))
            raise ArchiveError(f"case {cid}: field {name}: row {r} violates 0 <= start <= end <= cols "
                               f"(start={int(starts[r])}, end={int(ends[r])}, cols={cols})")


def _logical_dtype(x: np.ndarray | torch.Tensor) -> str:
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            return "bfloat16"
        if x.dtype == torch.float32:
            return "float32"
        raise ArchiveError(f"field values: dtype {x.dtype} is not one of {', '.join(DTYPES)}")
    if x.dtype == np.float32:
        return "float32"
    raise ArchiveError(f"field values: numpy dtype {x.dtype} is not float32 (pass bfloat16 as a torch tensor)")


def _to_numpy(x: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().contiguous()
        if x.dtype == torch.bfloat16:
            return x.view(torch.int16).numpy().view(np.uint16)
        return x.numpy()
    return np.ascontiguousarray(x)


def _numpy_to_torch(a: np.ndarray, dtype: str = "float32") -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a))


def _sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).view(np.uint8).data).hexdigest()


# --------------------------------------------------------------------------------------------- archive


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
    def provenance(self) -> dict[str, Any]:
        """The case's provenance attributes; empty when they are missing or not a JSON object."""
        prov = self.attrs.get("provenance")
        return prov if isinstance(prov, dict) else {}


def _codecs() -> list[Any]:
    # Measured by bench/codecs.py (bench/RESULTS.md): on normal float32 logits Blosc lz4+bitshuffle
    # compresses a little better than Zstd-1 (1.11x vs 1.08x) and decodes ~2x faster; Zstd-1 wins only on
    # rows of mostly exact zeros. Capture writes and replay reads at speed, so speed decides.
    from zarr.codecs import BloscCodec

    return [BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")]


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

        p = Path(path)
        if p.suffix == ".zip":
            raise ArchiveError(f"{p}: write to a directory archive, then `pack` it to a zip")
        if p.exists() and (p / "zarr.json").exists():
            if not exist_ok:
                raise ArchiveError(f"{p}: archive exists")
            return cls.open(p, mode="a")
        if p.exists() and any(p.iterdir()):
            raise ArchiveError(f"{p}: exists and is not an archive; refusing to write into it")
        group = zarr.open_group(str(p), mode="w-", zarr_format=3)
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

        loc = os.fspath(location)
        is_url = "://" in loc
        try:
            if not is_url and loc.endswith(".zip"):
                if mode != "r":
                    raise ArchiveError(f"{loc}: zip archives are read-only")
                if not Path(loc).is_file():
                    raise ArchiveError(f"{loc}: no such file")
                store: Any = ZipStore(loc, mode="r")
            elif is_url:
                if mode != "r":
                    raise ArchiveError(f"{loc}: remote archives are read-only")
                if loc.startswith("hf://"):
                    from logitreplay.datasets.hub import pin_url

                    loc = pin_url(loc)  # read, and record in `location`, one commit, not a moving branch
                store = zarr.storage.FsspecStore.from_url(loc, storage_options=storage_options, read_only=True)
            else:
                if not (Path(loc) / "zarr.json").is_file():
                    raise ArchiveError(f"{loc}: not a logitreplay archive (no zarr.json)")
                store = zarr.storage.LocalStore(loc, read_only=(mode == "r"))
            # Consolidated metadata (`push` writes it for the Hub) lists every case in one request; only
            # remote copies use it: a case appended to a local copy would be missing from it.
            group = zarr.open_group(store, mode="r" if mode == "r" else "r+", zarr_format=3,
                                    use_consolidated=None if is_url else False)
        except ArchiveError:
            raise
        except (FileNotFoundError, KeyError) as e:
            raise ArchiveError(f"{loc}: not a logitreplay archive ({type(e).__name__}: {e})") from None
        except zipfile.BadZipFile as e:
            raise ArchiveError(f"{loc}: damaged zip ({e})") from None
        except (ValueError, TypeError, json.JSONDecodeError) as e:
            raise ArchiveError(f"{loc}: unreadable archive metadata ({one_line(e)})") from None
        return cls(group, loc, mode != "r")

    # -- listing

    def _cases_group(self) -> Any:
        try:
            return self._root["cases"]
        except KeyError:
            raise ArchiveError(f"{self.location}: archive has no 'cases' group") from None

    def infos(self) -> list[CaseInfo]:
        """Every case group, complete or not, sorted by id (attributes only, no values read). A group
        whose metadata cannot be parsed is listed as incomplete, with the reason in its attributes."""
        cases = self._cases_group()
        out = []
        for name in _child_names(cases):
            try:
                attrs = dict(cases[name].attrs)
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
        return sum(f.stat().st_size for f in d.rglob("*") if f.is_file())

    # -- reading

    def read(self, case_id: str) -> Case:
        """Read one complete case, verifying the sha256 of every array and every invariant of the format."""
        try:
            grp = self._cases_group()[case_id]
            attrs = dict(grp.attrs)
        except KeyError:
            raise ArchiveError(f"case {case_id}: not in {self.location}") from None
        except Exception as e:  # malformed metadata: report, never guess
            raise ArchiveError(f"case {case_id}: unreadable metadata ({type(e).__name__}: {one_line(e)})") from None
        if attrs.get("complete") is not True:
            raise ArchiveError(f"case {case_id}: incomplete (its writer did not finish); not data")
        if attrs.get("schema_version") != SCHEMA_VERSION:
            raise ArchiveError(f"case {case_id}: field schema_version: {attrs.get('schema_version')!r} "
                               f"is not supported (expected {SCHEMA_VERSION})")
        for key in ("top_k", "cols", "row_stride"):
            if type(attrs.get(key)) is not int:
                raise ArchiveError(f"case {case_id}: field {key}: expected an integer, got {attrs.get(key)!r}")
        for key in ("checksums", "provenance"):
            if not isinstance(attrs.get(key), dict):
                raise ArchiveError(f"case {case_id}: field {key}: not a JSON object")
        dtype = attrs.get("dtype")
        if dtype not in DTYPES:
            raise ArchiveError(f"case {case_id}: field dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
        arrays: dict[str, np.ndarray] = {}
        for name in CASE_ARRAYS:
            if name == "reference_indices" and attrs.get("has_reference") is not True:
                continue
            arrays[name] = self._read_array(case_id, grp, name, attrs["checksums"])
        case = Case(case_id, arrays["values"], arrays["offsets"], arrays["row_starts"], arrays["row_ends"],
                    attrs["top_k"], attrs["cols"], attrs["row_stride"], dtype,
                    arrays.get("reference_indices"), dict(attrs["provenance"]))
        case.validate()
        return case

    def _read_array(self, case_id: str, grp: Any, name: str, checksums: dict[str, Any]) -> np.ndarray:
        try:
            arr = grp[name]
        except KeyError:
            raise ArchiveError(f"case {case_id}: field {name}: array missing") from None
        try:
            data = np.asarray(arr[...])
        except Exception as e:  # a damaged chunk fails inside the codec with any exception type
            raise ArchiveError(f"case {case_id}: field {name}: checksum error: chunk unreadable "
                               f"({type(e).__name__}: {one_line(e)})") from None
        want = checksums.get(name)
        if want is None:
            raise ArchiveError(f"case {case_id}: field {name}: no checksum recorded")
        if _sha256(data) != want:
            raise ArchiveError(f"case {case_id}: field {name}: checksum error: sha256 mismatch "
                               "(damaged or missing chunk)")
        return data

    # -- writing

    def write(self, case: Case, overwrite: bool = False) -> None:
        """Write every array, then mark the case `complete` (the last, atomic step)."""
        if not self.writable:
            raise ArchiveError(f"{self.location}: opened read-only")
        case.validate()
        cases = self._cases_group()
        if case.case_id in cases:
            if not overwrite:
                raise ArchiveError(f"case {case.case_id}: already in {self.location}")
            del cases[case.case_id]
        if "/" in case.case_id or case.case_id.startswith(".") or not case.case_id:
            raise ArchiveError(f"case {case.case_id!r}: field case_id: must be a non-empty name without '/'")
        grp = cases.create_group(case.case_id)
        checksums = {}
        for name in CASE_ARRAYS:
            data = getattr(case, name)
            if data is None:
                continue
            write_array(grp, name, data)
            checksums[name] = _sha256(data)
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
                if f.is_file():
                    zf.write(f, f.relative_to(src).as_posix())
        os.replace(tmp, dst)
        return dst

    def remove_incomplete(self) -> list[str]:
        """Delete case groups a killed writer left behind (only in a writable directory archive)."""
        if not self.writable:
            raise ArchiveError(f"{self.location}: opened read-only")
        gone = self.incomplete()
        for cid in gone:
            shutil.rmtree(Path(self.location) / "cases" / cid)
        return gone


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


def one_line(e: BaseException, limit: int | None = 200) -> str:
    """The message of `e` on one line (every run of whitespace one space), cut to `limit` characters
    (None: whole): user-facing errors are one line."""
    return " ".join(str(e).split())[:limit]


__all__ = ["SCHEMA_VERSION", "DTYPES", "ELEMENT_BYTES", "ArchiveError", "Case", "CaseInfo", "Archive",
           "gather_rows", "one_line", "utc_now"]
