"""The `logitreplay` command: one click group, one module per command group.

This package is the top layer: the stages (capture, datasets, replay, selectors) never import it and
never print or exit; it is the only place that turns their results into terminal output and exit codes.
Errors users can cause (bad input, missing files, unusable archives) are `LogitreplayError`s and surface
as one line on stderr with a non-zero exit; tracebacks are for bugs.
"""

from __future__ import annotations

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="logitreplay")
def main() -> None:
    """Capture sparse-attention indexer logits, share them, and replay them against top-k selectors."""


def _register() -> None:
    from logitreplay.cli.capture import capture_group
    from logitreplay.cli.datasets import inspect_cmd, synth_cmd
    from logitreplay.cli.kernels import build_kernels_cmd
    from logitreplay.cli.replay import replay_cmd
    from logitreplay.cli.share import COMMANDS as SHARE_COMMANDS

    for cmd in (synth_cmd, inspect_cmd, capture_group, replay_cmd, build_kernels_cmd, *SHARE_COMMANDS):
        main.add_command(cmd)


_register()
