"""What keeps a damaged or hostile store from hanging, exhausting or escaping a run.

An archive is untrusted input: its metadata can claim any shape, any number of chunks and any attribute,
and its files can be FIFOs, devices or symbolic links. Reading never blocks on a file that is not a
regular one, the work a metadata document can ask for (chunk count, shapes) is bounded and checked
against the case's other arrays before anything is allocated, allocations are checked against the memory
actually available, and writers never follow a symbolic link out of the archive. Two writers of one
archive are kept apart by a lock file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import math
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from logitreplay.errors import ArchiveError

# A metadata document (`zarr.json`) larger than this is not one this project wrote.
MAX_METADATA_BYTES = 16 << 20
# Chunks an array of n elements may be stored in: the writer uses chunks of up to 4 Mi elements, so
# honest arrays need a handful; a document asking for one chunk per element is refused before reading.
_MIN_ELEMENTS_PER_CHUNK = 4096
_FREE_CHUNKS = 64
LOCK_FILE = ".logitreplay.lock"


def _check_regular(path: Path) -> None:
    """Refuse to open a FIFO, a device or a socket (opening one blocks or reads forever)."""
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return  # the store reports it missing
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        raise ArchiveError(f"{path}: not a regular file; refusing to read it")
    if path.name == "zarr.json" and st.st_size > MAX_METADATA_BYTES:
        raise ArchiveError(f"{path}: metadata of {st.st_size} bytes, more than the {MAX_METADATA_BYTES} "
                           "a logitreplay archive writes")


@functools.cache
def _guarded_store_class() -> type:
    from zarr.storage import LocalStore  # zarr is imported only when an archive is opened

    class GuardedLocalStore(LocalStore):
        """zarr's local store, except that only regular files are ever opened (see `_check_regular`)."""

        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            _check_regular(self.root / key)
            return await super().get(key, prototype, byte_range)

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
            key_ranges = list(key_ranges)
            for key, _ in key_ranges:
                _check_regular(self.root / key)
            return await super().get_partial_values(prototype, key_ranges)

    return GuardedLocalStore


def guarded_local_store(root: str, read_only: bool) -> Any:
    """A zarr local store of `root` that never opens a FIFO, a device or an oversized metadata file."""
    return _guarded_store_class()(root, read_only=read_only)


def check_array(where: str, arr: Any, dtype: np.dtype[Any], shape: tuple[int, ...]) -> None:
    """Raise unless `arr` is a zarr array of `dtype` and `shape` stored in a bounded number of chunks:
    checked from its metadata alone, before a chunk is read or a byte allocated."""
    import zarr

    if not isinstance(arr, zarr.Array):
        raise ArchiveError(f"{where}: not an array (its metadata says {type(arr).__name__.lower()})")
    if arr.dtype != dtype:
        raise ArchiveError(f"{where}: stored as {arr.dtype}, expected {dtype}")
    if tuple(arr.shape) != shape:
        raise ArchiveError(f"{where}: shape {tuple(arr.shape)} does not match the case's {shape}")
    chunks = tuple(arr.chunks)
    if len(chunks) != len(shape) or any(type(c) is not int or c < 1 for c in chunks):
        raise ArchiveError(f"{where}: malformed chunk shape {chunks}")
    count = math.prod(math.ceil(s / c) for s, c in zip(shape, chunks, strict=True))
    elements = math.prod(shape)
    if count > _FREE_CHUNKS + elements // _MIN_ELEMENTS_PER_CHUNK:
        raise ArchiveError(f"{where}: {count} chunks for {elements} elements (chunks of {chunks}); "
                           "refusing to read that many")


def available_memory(device: torch.device | str) -> int:
    """Bytes that can be allocated now on `device`: free GPU memory, or the host's MemAvailable."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_memory(where: str, what: str, nbytes: int, device: torch.device | str = "cpu") -> None:
    """Raise (one line) before allocating `nbytes` that `device` does not have: a claimed size in an
    archive must end that case, never the run (or the machine)."""
    free = available_memory(device)
    if nbytes > free:
        raise ArchiveError(f"{where}: needs {_gib(nbytes)} for {what}, more than the {_gib(free)} available "
                           f"on {torch.device(device).type}")


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def inside(root: Path, path: Path) -> Path:
    """`path` (under `root`), refused when it or any folder between it and `root` is a symbolic link, so
    a writer (or a remover) never reaches outside the archive through one."""
    rel = path.relative_to(root)
    probe = root
    for part in rel.parts:
        probe = probe / part
        if probe.is_symlink():
            raise ArchiveError(f"{probe}: a symbolic link inside the archive; refusing to write through it")
    return path


@contextlib.contextmanager
def writer_lock(root: Path, wait: bool = False) -> Iterator[None]:
    """Hold the archive's lock file for the block. Without `wait`, fail at once (one line) when another
    process holds it, so two writers of one archive never interleave; with `wait` (the short creation
    of an archive), queue behind it, so two processes creating one archive both end up appending."""
    root.mkdir(parents=True, exist_ok=True)
    path = inside(root, root / LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ArchiveError(f"{root}: archive is being written by another process; try again when it "
                                   "has finished") from None
            raise
        yield
    finally:
        os.close(fd)
