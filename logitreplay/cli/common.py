"""What every command shares: one-line errors, the `--json [FILE]` convention, output paths checked before
any work starts, plurals, and progress (a bar on a terminal, throttled lines elsewhere)."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from logitreplay.errors import LogitreplayError, one_line

F = TypeVar("F", bound=Callable[..., Any])

# `--json` alone (or `--json -`) prints to stdout; `--json FILE` writes FILE.
STDOUT = "-"


def user_errors(fn: F) -> F:
    """Turn every `LogitreplayError` (and a missing or unreadable file) into a `click` error: one line, exit 1.

    Ctrl-C ends the command with one line and exit 130. zarr runs its I/O on an asyncio loop in a
    background thread; the tasks pending there when the interpreter exits would otherwise each log
    "Task was destroyed but it is pending!"."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (LogitreplayError, FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError) as e:
            raise click.ClickException(one_line(e, None)) from None
        except KeyboardInterrupt:
            logging.getLogger("asyncio").disabled = True
            click.echo("interrupted", err=True)
            raise click.exceptions.Exit(130) from None

    return wrapper  # type: ignore[return-value]


def _json_target(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`--json` takes an optional FILE, so `inspect --json ARCHIVE` would read ARCHIVE as that file:
    refuse a directory and any existing file that is not JSON, instead of writing over an archive."""
    if value is None or value == STDOUT:
        return value
    if Path(value).is_dir():
        raise click.BadParameter(f"{value} is a directory (write `--json -`, or put --json last, to print "
                                 "to stdout)", ctx, param)
    check_json_target(Path(value), "--json", " (write `--json -`, or put --json last, to print to stdout)")
    return value


def _head(path: Path) -> bytes | None:
    """The first bytes of an existing, non-empty regular file (None for anything else)."""
    if not path.is_file() or not path.stat().st_size:
        return None
    with path.open("rb") as f:
        return f.read(256)


def refuse_other_kind(path: Path, option: str, kind: str, looks_like: Callable[[bytes], bool],
                      hint: str = "") -> None:
    """An output file is written over only when it is empty, new, or of its own kind (a JSON report by a
    JSON report, a CSV by a CSV): an earlier report, an archive or a plot named by mistake is kept."""
    head = _head(path)
    if head is not None and not looks_like(head):
        raise click.BadParameter(f"{path} exists and is not a {kind} file; refusing to overwrite it{hint}",
                                 param_hint=option)


def check_json_target(path: Path, option: str, hint: str = "") -> None:
    """`check_file_target` for a JSON output: an existing file that is not JSON is refused."""
    refuse_other_kind(path, option, "JSON", lambda head: head.lstrip()[:1] in (b"{", b"["), hint)
    check_file_target(path, option)


def json_option(what: str) -> Callable[[F], F]:
    """The `--json [FILE]` option of every command: `what` is the JSON's content, e.g. "the written case ids"."""
    return click.option("--json", "json_out", is_flag=False, flag_value=STDOUT, default=None, metavar="[FILE]",
                        callback=_json_target,
                        help=f"{what} as JSON: to stdout (`--json`, `--json -`) or to FILE (`--json FILE`).")


def emit_json(data: Any, target: str, indent: int | None = None) -> None:
    """Print `data` as JSON to stdout, or write it to the file `target`."""
    text = json.dumps(data, indent=indent, allow_nan=False)
    if target == STDOUT:
        click.echo(text)
    else:
        Path(target).write_text(text + "\n")


def check_file_target(path: Path, option: str) -> None:
    """Fail now, in one line, when `path` cannot be written, instead of after the whole run: open it for
    appending (which creates it) and remove it again if it did not exist."""
    if path.is_dir():
        raise click.BadParameter(f"{path} is a directory", param_hint=option)
    existed = path.exists()
    try:
        with path.open("a"):
            pass
    except OSError as e:
        raise click.BadParameter(f"{path}: cannot write ({e.strerror or type(e).__name__})",
                                 param_hint=option) from None
    if not existed:
        path.unlink()


def check_dir_target(path: Path, option: str) -> None:
    """Fail now, in one line, when the directory `path` cannot be created or written into: it must not be
    an existing file, and its nearest existing ancestor must be a writable directory."""
    if path.exists() and not path.is_dir():
        raise click.BadParameter(f"{path} exists and is not a directory", param_hint=option)
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise click.BadParameter(f"{path}: {existing} is not a directory", param_hint=option)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise click.BadParameter(f"{path}: {existing} is not writable", param_hint=option)


def plural(n: int, word: str) -> str:
    """`1 case`, `2 cases`."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# Off a terminal, a progress line at most this often (and only after an item ends): a long replay piped to
# a file or a CI log shows it is alive without flooding it.
PROGRESS_EVERY_S = 10.0


def progress(iterable: Any, total: int, description: str) -> Any:
    """A rich progress bar on a terminal; elsewhere (logs, pipes, CI) the items as they are, with a line
    on stderr at most every PROGRESS_EVERY_S seconds: how many are done and about how long the rest takes."""
    if not sys.stderr.isatty():
        return _progress_lines(iterable, total, description)
    from rich.console import Console
    from rich.progress import track

    return track(iterable, total=total, description=description, console=Console(stderr=True), transient=True)


def _progress_lines(iterable: Any, total: int, description: str) -> Any:
    start = last = time.monotonic()
    for done, item in enumerate(iterable, 1):
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S and done < total:
            left = (now - start) / done * (total - done)
            click.echo(f"{description}: {done} of {total} done after {duration(now - start)}, about "
                       f"{duration(left)} left", err=True)
            last = now
        yield item


def duration(seconds: float) -> str:
    """`42 s`, `7 min`, `2.5 h`."""
    if seconds < 100:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 6000 else f"{seconds / 3600:.1f} h"
