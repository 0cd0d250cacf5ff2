"""`sglang.srt.utils`: the platform probes the DSA modules read at import (CUDA only here)."""


def is_hip() -> bool:
    return False


def is_xpu() -> bool:
    return False
