"""The `logitreplay` command: one click group; each stage contributes its own commands.

Errors that users can cause (bad input, missing files, unusable archives) surface as one line on stderr
and a non-zero exit; tracebacks are for bugs.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from logitreplay.archive import ArchiveError, one_line

F = TypeVar("F", bound=Callable[..., Any])


def user_errors(fn: F) -> F:
    """Turn the project's user-facing exceptions into `click` errors (one line, exit 1)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from logitreplay.selectors.base import SelectorError

        try:
            return fn(*args, **kwargs)
        except (ArchiveError, SelectorError, FileNotFoundError, PermissionError) as e:
            raise click.ClickException(one_line(e, None)) from None

    return wrapper  # type: ignore[return-value]


def progress(iterable: Any, total: int, description: str) -> Any:
    """A rich progress bar on a terminal, a plain iterator otherwise (logs and pipes stay clean)."""
    if not sys.stderr.isatty():
        return iterable
    from rich.console import Console
    from rich.progress import track

    return track(iterable, total=total, description=description, console=Console(stderr=True), transient=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logitreplay")
def main() -> None:
    """Capture sparse-attention indexer logits, share them, and replay them against top-k selectors."""


def _register() -> None:
    from logitreplay.capture.commands import capture_group
    from logitreplay.datasets.commands import inspect_cmd, synth_cmd
    from logitreplay.datasets.share_commands import COMMANDS as SHARE_COMMANDS
    from logitreplay.replay.commands import replay_cmd
    from logitreplay.selectors.cuda.commands import build_kernels_cmd

    for cmd in (synth_cmd, inspect_cmd, capture_group, replay_cmd, build_kernels_cmd, *SHARE_COMMANDS):
        main.add_command(cmd)


_register()

if __name__ == "__main__":
    sys.exit(main())
