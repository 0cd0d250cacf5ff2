"""`sglang.srt.environ.envs`: typed environment switches, read with `.get()` (defaults as in 0.5.23)."""

from __future__ import annotations

import os


class EnvBool:
    def __init__(self, default: bool) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type | None = None) -> EnvBool:
        return self

    def get(self) -> bool:
        value = os.environ.get(self.name)
        return self.default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


class EnvStr(EnvBool):
    def get(self) -> str | None:  # type: ignore[override]
        return os.environ.get(self.name, self.default)  # type: ignore[arg-type]


class Envs:
    SGLANG_OPT_USE_TOPK_V2 = EnvBool(True)
    SGLANG_DSA_FUSE_TOPK = EnvBool(True)
    SGLANG_DSA_TOPK_BROADCAST = EnvBool(False)
    SGLANG_DSA_TOPK_FLASHINFER_DETERMINISTIC = EnvBool(False)
    SGLANG_PLUGINS = EnvStr(None)  # type: ignore[arg-type]


envs = Envs()
