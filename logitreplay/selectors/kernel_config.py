"""The bundled kernels' constants, one copy each: `cuda/<kernel>_config.h`, which the kernel's `.cu`
includes and the CPU models (cpu_models.py) read through this module.

A config header holds only what C++ and this reader take alike: integer constants written as literals
(`constexpr int kBins = 2048;`), one struct of int fields on one line (`struct Class { int k_max, elems; };`)
and tables of it, one row of literals a line (`constexpr Class kClasses[] = {`, `{512, 8},`, `};`),
besides comments, `#pragma once`, `#include <...>` and the namespace. Nothing is evaluated: any other
line (an expression, a macro) is refused with its file and line, so a value derived from others is
written out in the config and its relation checked where the kernel relies on it (a static_assert).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from logitreplay.errors import BuildError

CONFIG_DIR = Path(__file__).resolve().parent / "cuda"

_SKIPPED = re.compile(r"#pragma once|#include <\w+>|namespace \w+ \{|\}")
_CONSTANT = re.compile(r"constexpr (?:int|long long|uint32_t) (k\w+) = (\d+)u?;")
_STRUCT = re.compile(r"struct (\w+) \{ int ([\w, ]+); \};")
_TABLE = re.compile(r"constexpr (\w+) (k\w+)\[\] = \{")
_ROW = re.compile(r"\{(\d+(?:, \d+)*)\},")


@dataclass(frozen=True)
class KernelConfig:
    """One kernel's config: its constants, and each table's rows by field name."""

    constants: dict[str, int]
    tables: dict[str, list[dict[str, int]]]


def path(kernel: str) -> Path:
    return CONFIG_DIR / f"{kernel}_config.h"


@functools.cache
def load(kernel: str) -> KernelConfig:
    """The config of bundled kernel `kernel` (native, deepselect, split)."""
    file = path(kernel)
    return parse(file.read_text(), file.name)


def parse(text: str, name: str) -> KernelConfig:
    """A config header's constants and tables; `name` is the file named in errors."""
    constants: dict[str, int] = {}
    tables: dict[str, list[dict[str, int]]] = {}
    fields: dict[str, list[str]] = {}  # struct name -> its fields
    table: tuple[str, list[str]] | None = None  # the table being read: its name and row fields
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("//", 1)[0].strip()
        where = f"{name}:{number}"
        if table is not None:
            if line == "};":
                table = None
            elif m := _ROW.fullmatch(line):
                values = [int(v) for v in m[1].split(", ")]
                if len(values) != len(table[1]):
                    raise _refused(where, raw, f"{len(values)} values, {len(table[1])} fields")
                tables[table[0]].append(dict(zip(table[1], values, strict=True)))
            elif line:
                raise _refused(where, raw, "not a row of integer literals")
        elif m := _CONSTANT.fullmatch(line):
            constants[m[1]] = int(m[2])
        elif m := _STRUCT.fullmatch(line):
            fields[m[1]] = [f.strip() for f in m[2].split(",")]
        elif m := _TABLE.fullmatch(line):
            if m[1] not in fields:
                raise _refused(where, raw, f"a table of {m[1]}, a struct not declared above it")
            table = (m[2], fields[m[1]])
            tables[m[2]] = []
        elif line and not _SKIPPED.fullmatch(line):
            raise _refused(where, raw, "not a literal constant, struct or table")
    if table is not None:
        raise BuildError(f"{name}: table {table[0]} is not closed")
    return KernelConfig(constants, tables)


def _refused(where: str, raw: str, why: str) -> BuildError:
    return BuildError(f"{where}: {why}: {raw.strip()!r}")


__all__ = ["KernelConfig", "load", "parse", "path"]
