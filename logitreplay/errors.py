"""Every error the project raises on purpose, under one base class, and the one-line formatting they share.

A command catches `LogitreplayError` once and prints its message as one line with a non-zero exit:
anything else that escapes is a bug and keeps its traceback. Each stage raises its own subclass, so a
caller that cares (a test, a plugin host) can still tell an unusable archive from an unbuildable kernel.
The classes also derive from the built-in they replaced, so `except ValueError` keeps working.
"""

from __future__ import annotations


class LogitreplayError(ValueError):
    """Base of every user-facing error: its message is one line that names what is wrong and where."""


class ArchiveError(LogitreplayError):
    """An archive or a case is unusable (names the case and the field)."""


class SelectorError(LogitreplayError):
    """A selector could not be found or built (names the selector)."""


class BuildError(SelectorError):
    """The bundled CUDA kernels could not be compiled or loaded."""


class KernelError(SelectorError):
    """A bundled kernel refused its arguments (the C entry point's return code, named)."""


class ReplayError(LogitreplayError):
    """A replay could not go on (an isolated child that never started, or never read its next case)."""


class CaptureError(LogitreplayError):
    """A capture cannot be set up (no indexer found, a module without a mask argument, ...)."""


class LayoutError(CaptureError):
    """A tensor did not look like an indexer's score matrix or mask (disables that capture)."""


class PolicyError(LogitreplayError):
    """A capture policy is malformed (unknown key, bad size, bad layer list)."""


class DecisionError(LogitreplayError):
    """A decision cannot be made from the measurements given: no common cases to fit a dispatch rule
    on, or two reports that measured different things (`compare`)."""


def one_line(e: BaseException | str, limit: int | None = 200) -> str:
    """The message of `e` on one line (every run of whitespace one space), cut to `limit` characters
    (None: whole): user-facing errors are one line."""
    return " ".join(str(e).split())[:limit]


__all__ = ["ArchiveError", "BuildError", "CaptureError", "DecisionError", "KernelError", "LayoutError", "LogitreplayError",
           "PolicyError", "ReplayError", "SelectorError", "one_line"]
