"""The shared data model, the ground floor of the project: cases, the zarr archive, remote locations.

Nothing here imports any other part of logitreplay except `logitreplay.errors`: every stage builds on
this package, so it must not depend on any of them.
"""

from logitreplay.archive.case import CASE_ARRAYS, DTYPES, ELEMENT_BYTES, STORAGE_DTYPE, Case, gather_rows
from logitreplay.archive.decode import KINDS, DecodeFacts
from logitreplay.archive.store import SCHEMA_VERSION, Archive, CaseInfo, chunk_shape, utc_now, write_array
from logitreplay.errors import ArchiveError

__all__ = ["CASE_ARRAYS", "DTYPES", "ELEMENT_BYTES", "KINDS", "SCHEMA_VERSION", "STORAGE_DTYPE", "Archive",
           "ArchiveError", "Case", "CaseInfo", "DecodeFacts", "chunk_shape", "gather_rows", "utc_now", "write_array"]
