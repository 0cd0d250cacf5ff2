"""`logitreplay build-kernels`: build the bundled CUDA kernels ahead of time (otherwise first use does)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import click

from logitreplay.cli.common import emit_json, json_option, user_errors
from logitreplay.replay.report import Column, render
from logitreplay.selectors.cuda import build


@click.command("build-kernels")
@click.option("--arch", default=None, metavar="sm_XX[a]",
              help="Target architecture, e.g. sm_90a; default: the current CUDA device's exact one.")
@click.option("--kernel", "names", multiple=True, metavar="NAME",
              help="Build only these kernel families (repeatable); default: all bundled ones.")
@json_option("Each library's path and build time")
@user_errors
def build_kernels_cmd(arch: str | None, names: tuple[str, ...], json_out: str | None) -> None:
    """Compile the bundled kernels with this machine's nvcc into the user cache (cached by source hash)."""
    target = arch or build.device_arch()
    build.check_arch(target, build.toolchain())
    todo = list(names) or build.kernel_names()

    def one(name: str) -> tuple[str, str, float]:
        t0 = time.perf_counter()
        path = build.build(name, target)
        return name, str(path), time.perf_counter() - t0

    # nvcc is single-threaded per file: the families build in parallel.
    with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
        results = list(pool.map(one, todo))
    if json_out is not None:
        emit_json({"arch": target, "nvcc": build.toolchain().version,
                   "kernels": {n: {"path": p, "seconds": round(s, 2)} for n, p, s in results}}, json_out)
        return
    columns = [Column("kernel"), Column("arch"), Column("seconds", right=True), Column("library", fold=True)]
    click.echo("\n".join(render(columns, [[n, target, f"{s:.2f}", p] for n, p, s in results])))
