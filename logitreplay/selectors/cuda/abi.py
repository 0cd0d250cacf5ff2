"""The Python binding of the kernels' C interface (`topk_api.h`): one table, bound once per library.

ctypes cannot read a header, so the interface is necessarily written twice, once in C and once here;
`ENTRY_POINTS` and the `LR_*` constants are that second statement, named exactly as in the header so that
tests/test_cuda_build.py can compare the two and fail when either side changes alone. Everything else
(the selectors in kernels.py, the build in build.py) takes the interface from here.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import NamedTuple

from logitreplay.errors import BuildError
from logitreplay.selectors.cuda import build

# LrError: what lr_<family>_topk returns.
LR_OK, LR_EINVAL, LR_EWORKSPACE, LR_ELAUNCH = 0, 1, 2, 3
# LrDtype: the `dtype` argument.
LR_F32, LR_BF16 = 0, 1
# LrStatusFlag: the bits kernels OR into the workspace's status header.
LR_STATUS_NAN = 1
# sizeof(LrStatus), which is also the workspace's alignment: the smallest workspace any family accepts.
STATUS_BYTES = 256
# sizeof(LrWork): one row's work record (in work builds, at the end of the workspace), its uint32 counters.
WORK_BYTES, WORK_COUNTERS = 16, 4

DTYPES = {"float32": LR_F32, "bfloat16": LR_BF16}
MESSAGES = {LR_EINVAL: "invalid argument", LR_EWORKSPACE: "workspace too small", LR_ELAUNCH: "kernel launch failed"}

_P, _I, _LL = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong


class Signature(NamedTuple):
    restype: type
    args: tuple[tuple[str, type], ...]  # (name in topk_api.h, ctypes type), in order


# Every entry point of a family, by the suffix of its symbol lr_<family>_<suffix>.
ENTRY_POINTS: dict[str, Signature] = {
    "topk": Signature(_I, (("logits", _P), ("dtype", _I), ("row_stride", _LL), ("row_starts", _P),
                           ("row_ends", _P), ("rows", _I), ("top_k", _I), ("out", _P), ("out_stride", _LL),
                           ("workspace", _P), ("workspace_bytes", _LL), ("stream", _P))),
    "workspace_bytes": Signature(_LL, (("rows", _I), ("cols", _I), ("top_k", _I), ("dtype", _I))),
    "max_top_k": Signature(_I, (("dtype", _I),)),
}


def symbol(family: str, entry: str) -> str:
    return f"lr_{family}_{entry}"


def typed(entry: str, *values: int) -> tuple[ctypes._SimpleCData, ...]:
    """`values` as ctypes objects of the entry point's leading argument types, converted once so that a
    prepared launch passes them as they are."""
    args = ENTRY_POINTS[entry].args
    if len(values) > len(args):
        raise TypeError(f"{symbol('<family>', entry)} takes {len(args)} arguments, got {len(values)}")
    return tuple(t(v) for (_, t), v in zip(args, values, strict=False))


def describe(rc: int) -> str:
    """The meaning of a non-zero return code, for an error message."""
    return MESSAGES.get(rc, f"error {rc}")


@functools.cache
def entry_points(family: str, arch: str | None = None, extra: tuple[str, ...] = ()) -> dict[str, Callable[..., int]]:
    """The family's entry points by suffix, typed from `ENTRY_POINTS` (the library built with `extra` flags
    and loaded if needed)."""
    return bind(build.load(family, arch, extra), family)


def bind(lib: ctypes.CDLL, family: str) -> dict[str, Callable[..., int]]:
    """The family's entry points in a loaded library (a bundled build, or one a benchmark built from
    another revision), by suffix, typed from `ENTRY_POINTS`."""
    fns: dict[str, Callable[..., int]] = {}
    for entry, sig in ENTRY_POINTS.items():
        try:
            fn = getattr(lib, symbol(family, entry))
        except AttributeError as e:
            raise BuildError(f"kernel {family}: {lib._name} lacks the C interface of topk_api.h ({e})") from None
        fn.argtypes = [t for _, t in sig.args]
        fn.restype = sig.restype
        fns[entry] = fn
    return fns
