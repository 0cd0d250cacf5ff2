"""What every command shares: one-line errors and the terminal-only progress bar."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from logitreplay.errors import LogitreplayError, one_line

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn every `LogitreplayError` (and a missing or unreadable file) into a `click` error: one line, exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (LogitreplayError, FileNotFoundError, PermissionError) as e:
            raise click.ClickException(one_line(e, None)) from None

    return wrapper  # type: ignore[return-value]


def progress(iterable: Any, total: int, description: str) -> Any:
    """A rich progress bar on a terminal, a plain iterator otherwise (logs and pipes stay clean)."""
    if not sys.stderr.isatty():
        return iterable
    from rich.console import Console
    from rich.progress import track

    return track(iterable, total=total, description=description, console=Console(stderr=True), transient=True)
