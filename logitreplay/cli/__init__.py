"""The `logitreplay` command: one click group, one module per command group.

This package is the top layer: the stages (capture, datasets, replay, selectors) never import it and
never print or exit; it is the only place that turns their results into terminal output and exit codes.
Errors users can cause (bad input, missing files, unusable archives) are `LogitreplayError`s and surface
as one line on stderr with a non-zero exit; tracebacks are for bugs.
"""

from __future__ import annotations

import sys
from typing import Any

import click


class _Group(click.Group):
    """click's group, with a usage error on one line (`Error: ... (see 'logitreplay replay --help')`)
    instead of the usage, a hint and a blank line around it."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # a bare group: its help, as click shows it
            e.show()
            sys.exit(e.exit_code)
        except click.UsageError as e:
            where = e.ctx.command_path if e.ctx is not None else "logitreplay"
            click.echo(f"Error: {e.format_message()} (see '{where} --help')", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logitreplay")
def main() -> None:
    """Capture sparse-attention indexer logits, share them, and replay them against top-k selectors."""


def _register() -> None:
    from logitreplay.cli.capture import capture_group
    from logitreplay.cli.compare import compare_cmd
    from logitreplay.cli.datasets import inspect_cmd, synth_cmd
    from logitreplay.cli.kernels import build_kernels_cmd
    from logitreplay.cli.merge import merge_cmd
    from logitreplay.cli.names import cases_cmd
    from logitreplay.cli.repair import repair_cmd
    from logitreplay.cli.replay import replay_cmd
    from logitreplay.cli.report import report_cmd
    from logitreplay.cli.selectors import selectors_cmd
    from logitreplay.cli.share import COMMANDS as SHARE_COMMANDS

    for cmd in (synth_cmd, inspect_cmd, cases_cmd, capture_group, replay_cmd, report_cmd, compare_cmd, merge_cmd,
                build_kernels_cmd, repair_cmd, selectors_cmd, *SHARE_COMMANDS):
        main.add_command(cmd)


_register()
