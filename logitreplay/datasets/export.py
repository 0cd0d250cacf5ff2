"""Cases as `.safetensors` files: the format a kernel author can load without installing logitreplay.

A file holds exactly what the kernel saw. safetensors stores only contiguous tensors, so `logits` is the
padded matrix's *storage*, shape (rows, row_stride), and the scalar tensor `cols` says how many columns
are the matrix; `logits[:, :cols]` is then a view whose stride(0) is the recorded row stride, as in the
engine. Cells outside `[row_starts[r], row_ends[r])` are filled (-inf by default) because they were never
data. Loading takes two lines::

    t = safetensors.torch.load_file("case.safetensors")
    logits, k = t["logits"][:, : t["cols"]], int(t["top_k"])   # + t["row_starts"], t["row_ends"]

The header metadata key `logitreplay` holds the case's JSON (id, shape facts, provenance, sha256 of the
in-range values), so `import` rebuilds the case bit for bit. Files from elsewhere need only a 2-D float32
or bfloat16 `logits` and `row_ends` (or vLLM's `ke`; starts default to 0, `ks` is accepted too).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from logitreplay.archive import SCHEMA_VERSION, Case
from logitreplay.archive.case import MAX_INDEX
from logitreplay.errors import ArchiveError, one_line

METADATA_KEY = "logitreplay"
# Accepted tensor names for files written by other tools, first match wins (vLLM calls the bounds ks/ke).
_START_NAMES = ("row_starts", "ks", "cu_seqlen_ks")
_END_NAMES = ("row_ends", "ke", "cu_seqlen_ke")
_FLOAT_DTYPES = (torch.float32, torch.bfloat16)


def case_to_tensors(case: Case, fill: float = -math.inf) -> dict[str, torch.Tensor]:
    """The tensors of the exported file (see the module docstring for their meaning)."""
    storage = case.padded(poison=fill)
    # `padded` returns a (rows, cols) view of a (rows, row_stride) buffer: export that buffer, including
    # the stride padding, so the kernel gets the same memory layout it had in the engine.
    base = storage.as_strided((case.rows, case.row_stride), (case.row_stride, 1))
    tensors = {
        "logits": base,
        "row_starts": torch.from_numpy(case.row_starts.copy()),
        "row_ends": torch.from_numpy(case.row_ends.copy()),
        "cols": torch.tensor(case.cols, dtype=torch.int64),
        "top_k": torch.tensor(case.top_k, dtype=torch.int64),
    }
    if case.reference_indices is not None:
        tensors["reference_indices"] = torch.from_numpy(case.reference_indices.copy())
    return tensors


def case_metadata(case: Case, fill: float) -> dict[str, str]:
    """Header metadata: safetensors allows only str -> str, so the case facts are one JSON string."""
    doc = {"schema_version": SCHEMA_VERSION, "case_id": case.case_id, "rows": case.rows, "cols": case.cols,
           "row_stride": case.row_stride, "top_k": case.top_k, "dtype": case.dtype,
           "fill": repr(float(fill)), "sha256": case.sha256(), "provenance": case.attrs}
    return {METADATA_KEY: json.dumps(doc, sort_keys=True)}


def export_case(case: Case, out_dir: Path, fill: float = -math.inf, overwrite: bool = False) -> Path:
    """Write `<out_dir>/<case_id>.safetensors` (through a temporary name, so no half file is left)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    dst = out_dir / f"{case.case_id}.safetensors"
    if dst.exists() and not overwrite:
        raise ArchiveError(f"{dst}: exists; refusing to overwrite it")
    tmp = dst.with_name(dst.name + ".partial")
    save_file(case_to_tensors(case, fill), str(tmp), metadata=case_metadata(case, fill))
    os.chmod(tmp, 0o666 & ~_umask())  # safetensors creates its files 0600; an export is meant to be shared
    os.replace(tmp, dst)
    return dst


def _umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _first(tensors: dict[str, torch.Tensor], names: tuple[str, ...]) -> torch.Tensor | None:
    return next((tensors[n] for n in names if n in tensors), None)


def _int_tensor(path: Path, name: str, t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool or t.shape != (rows,):
        raise ArchiveError(f"{path}: field {name}: expected integer ({rows},), got {t.dtype} {tuple(t.shape)}")
    return t.to(torch.int64)


def _load(path: Path, tensors: bool) -> tuple[dict[str, str], dict[str, Any], dict[str, torch.Tensor]]:
    """Header metadata, our parsed metadata block, and (if asked) the tensors of a safetensors file."""
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            data = {k: f.get_tensor(k) for k in f.keys()} if tensors else {}  # noqa: SIM118 (not a mapping)
    except (SafetensorError, OSError) as e:
        raise ArchiveError(f"{path}: not a readable safetensors file ({one_line(e)})") from None
    meta: dict[str, Any] = {}
    if METADATA_KEY in header:
        try:
            meta = json.loads(header[METADATA_KEY])
        except json.JSONDecodeError:
            raise ArchiveError(f"{path}: field metadata.{METADATA_KEY}: not JSON") from None
        if not isinstance(meta, dict):
            raise ArchiveError(f"{path}: field metadata.{METADATA_KEY}: not a JSON object")
    return header, meta, data


def _case_id(path: Path, meta: dict[str, Any]) -> str:
    cid = meta.get("case_id", path.name.removesuffix(".safetensors"))
    if not isinstance(cid, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+~=-]{0,199}", cid):
        raise ArchiveError(f"{path}: field case_id: {str(cid)[:60]!r} is not a case id (letters, digits and "
                           "_.+~=- only, not starting with '.' or '-')")
    return cid


def _integer(path: Path, name: str, meta: dict[str, Any], tensors: dict[str, torch.Tensor],
             default: int | None) -> int | None:
    """An integer fact of the file, from our metadata or a scalar tensor, refused unless it is exactly
    an integer (7.9, NaN, "x", null or a 2-element tensor are not silently made into one)."""
    if name in meta:
        value = meta[name]
        if type(value) is not int:
            raise ArchiveError(f"{path}: field {name}: expected an integer, got {str(value)[:40]!r}")
        return value
    t = tensors.get(name)
    if t is None:
        return default
    if t.numel() != 1 or t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise ArchiveError(f"{path}: field {name}: expected an integer scalar tensor, got {t.dtype} "
                           f"{tuple(t.shape)}")
    return int(t.reshape(()).item())


def case_id_of(path: Path) -> str:
    """The id `read_file` gives the file's case, from its header alone (no tensor is read)."""
    return _case_id(path, _load(path, tensors=False)[1])


def read_file(path: Path, top_k: int | None = None) -> Case:
    """Rebuild a case from a safetensors file: ours bit for bit, or any with `logits` and row bounds.

    `top_k` is needed only for a foreign file that carries neither a `top_k` tensor nor our metadata.
    """
    header, meta, tensors = _load(path, tensors=True)
    logits = tensors.get("logits")
    if logits is None or logits.dim() != 2 or logits.dtype not in _FLOAT_DTYPES:
        got = "missing" if logits is None else f"{logits.dtype} {tuple(logits.shape)}"
        raise ArchiveError(f"{path}: field logits: expected a 2-D float32 or bfloat16 matrix, got {got}")
    rows, width = logits.shape
    ends_t = _first(tensors, _END_NAMES)
    if ends_t is None:
        raise ArchiveError(f"{path}: field row_ends: missing (also looked for {', '.join(_END_NAMES[1:])})")
    ends = _int_tensor(path, "row_ends", ends_t, rows)
    starts_t = _first(tensors, _START_NAMES)
    starts = torch.zeros(rows, dtype=torch.int64) if starts_t is None else _int_tensor(path, "row_starts", starts_t, rows)

    cols = _integer(path, "cols", meta, tensors, width)
    assert cols is not None
    if not 0 <= cols <= width:
        raise ArchiveError(f"{path}: field cols: {cols} is outside [0, {width}] (the logits width)")
    k = _integer(path, "top_k", meta, tensors, top_k)
    if k is None:
        raise ArchiveError(f"{path}: field top_k: not in the file; pass --top-k")
    if not 1 <= k <= MAX_INDEX:
        raise ArchiveError(f"{path}: field top_k: must be in [1, 2^31), got {k}")
    for name, want in (("rows", rows), ("row_stride", width)):
        if name in meta and meta[name] != want:
            raise ArchiveError(f"{path}: field {name}: {str(meta[name])[:40]!r}, but the logits say {want}")
    if "dtype" in meta and meta["dtype"] != {torch.float32: "float32", torch.bfloat16: "bfloat16"}[logits.dtype]:
        raise ArchiveError(f"{path}: field dtype: {str(meta['dtype'])[:40]!r} does not match the logits' {logits.dtype}")
    if "sha256" in meta and not isinstance(meta["sha256"], str):
        raise ArchiveError(f"{path}: field sha256: expected a hex string")
    case_id = _case_id(path, meta)
    attrs = meta.get("provenance", {"imported_from": path.name, "metadata": header})
    if not isinstance(attrs, dict):
        raise ArchiveError(f"{path}: field provenance: not a JSON object")
    ref = tensors.get("reference_indices")
    if ref is not None and (ref.is_floating_point() or ref.is_complex() or ref.dtype == torch.bool
                            or ref.shape != (rows, k) or (ref.numel() and (ref.min() < -1 or ref.max() > MAX_INDEX))):
        raise ArchiveError(f"{path}: field reference_indices: expected integers in [-1, 2^31) of shape ({rows}, {k}), "
                           f"got {ref.dtype} {tuple(ref.shape)}")
    # The matrix is real data of the file's size; the claims above were all checked against it.
    case = Case.from_matrix(case_id, logits[:, :cols], starts, ends, top_k=k, row_stride=width,
                            reference_indices=None if ref is None else ref.to(torch.int32), attrs=attrs)
    if "sha256" in meta and case.sha256() != meta["sha256"]:
        raise ArchiveError(f"{path}: case {case_id}: field logits: sha256 of the in-range values does not "
                           "match the recorded one (damaged file)")
    return case
