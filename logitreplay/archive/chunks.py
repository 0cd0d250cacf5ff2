"""What a stored chunk must prove before a decompressor touches it.

A decompressor trusts the sizes written in its own header: Blosc given a chunk cut short (`truncate -s
1000` of a chunk file) reads past the end of the buffer, and the process dies of SIGSEGV instead of
reporting the case. So every chunk is checked first, in every reader (replay workers, `inspect`,
`export`, `push`: all read through zarr's codec pipeline, which these checks take part in):

- archives written since issue 40 store a CRC-32C of each compressed chunk after it (zarr's `crc32c`
  codec, last in the chain): zarr decodes a chain from its end, so the checksum is verified before Blosc
  sees a byte;
- Blosc itself is zarr's codec with one check added (`CheckedBlosc`): the header must state exactly the
  chunk's stored length and the chunk's decoded size, or the chunk is refused. That is all an older
  archive (no per-chunk checksum) can prove before decompression; its arrays' sha256 still catch damage
  afterwards.

An array whose codecs are not among `ALLOWED_CODECS` (the ones this project writes and the standard
memory-safe ones) is refused from its metadata, before any chunk is read.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from logitreplay.errors import ArchiveError

# Codec names an archive array may use: ours (bytes, blosc, crc32c; sharding_indexed for Hub copies) and
# the standard zarr v3 compressors whose decoders bound their reads by the input's length.
ALLOWED_CODECS = frozenset({"bytes", "blosc", "crc32c", "sharding_indexed", "zstd", "gzip"})
_BLOSC_HEADER = 16


def blosc_header_error(chunk: bytes | memoryview, decoded_bytes: int) -> str | None:
    """Why a Blosc chunk must not be decompressed (its header disagrees with the chunk), or None."""
    view = memoryview(chunk).cast("B")
    if len(view) < _BLOSC_HEADER:
        return f"{len(view)} bytes, shorter than a Blosc header"
    nbytes = int.from_bytes(view[4:8], "little")
    cbytes = int.from_bytes(view[12:16], "little")
    if cbytes != len(view):
        return f"{len(view)} bytes stored, its header says {cbytes} (truncated or damaged chunk)"
    if nbytes != decoded_bytes:
        return f"its header says {nbytes} bytes decoded, the array's chunk holds {decoded_bytes}"
    return None


@functools.cache
def install() -> None:
    """Make zarr decode every `blosc` codec with `CheckedBlosc` (once per process, before an archive is
    opened: zarr picks a codec's class when it parses an array's metadata)."""
    import zarr
    from zarr.codecs import BloscCodec
    from zarr.registry import register_codec

    class CheckedBlosc(BloscCodec):
        """zarr's Blosc codec, refusing a chunk whose header disagrees with it (module docstring)."""

        def _decode_sync(self, chunk_bytes: Any, chunk_spec: Any) -> Any:
            item = chunk_spec.dtype.to_native_dtype().itemsize
            why = blosc_header_error(chunk_bytes.as_numpy_array(), math.prod(chunk_spec.shape) * item)
            if why is not None:
                raise ArchiveError(f"checksum error: chunk refused before decompression: {why}")
            return super()._decode_sync(chunk_bytes, chunk_spec)

    qualname = f"{__name__}.CheckedBlosc"
    CheckedBlosc.__qualname__ = "CheckedBlosc"
    register_codec("blosc", CheckedBlosc, qualname=qualname)
    zarr.config.set({"codecs.blosc": qualname})


def codec_names(arr: Any) -> list[str]:
    """The names of every codec an array's metadata lists, those inside a shard's chains included."""
    names: list[str] = []

    def walk(codecs: Any) -> None:
        for codec in codecs or ():
            d = codec.to_dict() if hasattr(codec, "to_dict") else {}
            names.append(str(d.get("name", type(codec).__name__)))
            for inner in ("codecs", "index_codecs"):
                if hasattr(codec, inner):
                    walk(getattr(codec, inner))

    walk(getattr(arr.metadata, "codecs", ()))
    return names


def check_codecs(where: str, arr: Any) -> None:
    """Refuse an array whose codecs include one outside `ALLOWED_CODECS` (from its metadata alone)."""
    odd = sorted(set(codec_names(arr)) - ALLOWED_CODECS)
    if odd:
        raise ArchiveError(f"{where}: codec {', '.join(odd)} is not one a logitreplay archive uses "
                           f"({', '.join(sorted(ALLOWED_CODECS))}); refusing to decode it")
