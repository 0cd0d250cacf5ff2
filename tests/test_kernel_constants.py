"""The kernels' constants have one copy, each kernel's config (`cuda/<kernel>_config.h`): the kernel
includes it and defines none of its constants again, the CPU models read the same file (kernel_config.py),
and the reader refuses any line it would have to evaluate, so the two sides cannot drift apart. Also
holds the sources to one style of tunable and the sweep script to variants the sources still have, and
the model's keep_rank to the kernel's float arithmetic and its re-bet rule and narrow or wide choice to
the kernel's expressions."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import CodeType, SimpleNamespace

import pytest
import torch

from logitreplay.errors import BuildError
from logitreplay.selectors import cpu_models, kernel_config
from logitreplay.selectors.cuda import build

SOURCES = {name: (build.SOURCE_DIR / f"{name}.cu").read_text() for name in build.kernel_names()}


def tunables(src: str) -> dict[str, str]:
    """Every tunable of a source: constant name -> its override macro (`#ifdef LR_X` / the override /
    `#else` / the default / `#endif`)."""
    return {m[1]: m[0] for m in re.findall(
        r"#ifdef (LR_\w+)\n\s*(?:static )?constexpr [\w ]+? (k\w+) = \1\b[^;]*;\n#else\n(?:\s*//.*\n)*"
        r"\s*(?:static )?constexpr [\w ]+? \2 = [^;]+?;(?:\s*//.*)?\n#endif", src)}


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_kernel_takes_its_constants_from_its_config_alone(name: str) -> None:
    """The `.cu` includes its config and defines a constant of it only as a tunable (its default the
    config's) or as the config's own name: no second literal for the models to miss."""
    src = SOURCES[name]
    config = kernel_config.load(name)
    assert f'#include "{name}_config.h"' in src
    assert config.constants, name
    for const in config.constants:
        for m in re.finditer(rf"constexpr [\w ]+ {const} = ([^;]+);", src):
            assert "LR_" in m[1] or m[1].strip() == f"cfg::{const}", (name, m[0])


def test_the_config_reader_refuses_what_it_would_have_to_evaluate() -> None:
    text = ("#pragma once\nnamespace x {\nstruct Row { int k, n; };\nconstexpr int kA = 2048;  // bins\n"
            "constexpr Row kRows[] = {\n    {1, 2},\n    {3, 4},\n};\n}  // namespace x\n")
    config = kernel_config.parse(text, "x_config.h")
    assert config.constants == {"kA": 2048} and config.tables == {"kRows": [{"k": 1, "n": 2}, {"k": 3, "n": 4}]}
    for bad, line in (("constexpr int kA = 96 << 10;", 1), ("#define kA 3", 1),
                      ("struct Row { int k, n; };\nconstexpr Row kRows[] = {\n  {1, 2 * 3},\n};", 3)):
        with pytest.raises(BuildError, match=rf"x_config\.h:{line}: "):
            kernel_config.parse(bad, "x_config.h")
    with pytest.raises(BuildError, match="2 fields"):
        kernel_config.parse("struct Row { int k, n; };\nconstexpr Row kRows[] = {\n  {1},\n};", "x_config.h")


def test_every_tunable_has_one_style_and_the_sweep_offers_only_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))  # as the script sees bench/
    deepselect_tune = importlib.import_module("deepselect_tune")

    for name, src in SOURCES.items():
        overrides = set(re.findall(r"#ifn?def (LR_\w+)", src)) - {"LR_WORK_RECORD"}
        assert "#ifndef LR_" not in src, name
        assert overrides == set(tunables(src).values()), name
    for family, variants in deepselect_tune.FAMILIES.items():
        offered = {macro for defines in variants.values() for macro in defines}
        assert offered <= set(tunables(SOURCES[family]).values()), family


def test_deepselect_model_configuration_is_the_config_table() -> None:
    """Each class of deepselect_config.h, narrow and wide, is the model's configuration for that top_k and
    row stride, and a top_k past the last class takes the last."""
    config = kernel_config.load("deepselect")
    for table, stride in (("kClasses", cpu_models.DS_WIDE_STRIDE - 1), ("kWideClasses", cpu_models.DS_WIDE_STRIDE)):
        for row in config.tables[table]:
            cfg = cpu_models.deepselect_config(row["k_max"], stride)
            assert (cfg.k_max, cfg.warps * 32, cfg.elems, cfg.slack) == (row["k_max"], row["threads"], row["elems"],
                                                                       row["b2"]), (table, row)
            assert cfg.cap == row["k_max"] + row["b2"] + cfg.round  # kCap = K_MAX + kB2 + kRound
    narrow_only = {row["k_max"] for row in config.tables["kClasses"]} - set(cpu_models.DS_WIDE_CLASSES)
    assert cpu_models.deepselect_config(max(narrow_only), cpu_models.DS_WIDE_STRIDE).elems == 8
    assert cpu_models.deepselect_config(10**6, 8192).k_max == cpu_models.DS_CLASSES[-1]


def cpp_expression(src: str, pattern: str) -> CodeType:
    """The C++ expression that `pattern`'s group finds in `src`, compiled as Python: the operators the
    kernel's rules are written with (||, &&, !, integer /, one ?:), its identifiers left to the caller.
    Several groups (the conditions of nested ifs) make one expression that holds where all of them do."""
    found = re.search(pattern, src)
    assert found, pattern

    def python(expr: str) -> str:
        cond, _, rest = expr.partition("?")
        if rest:
            yes, no = re.split(r"(?<!:):(?!:)", rest, maxsplit=1)
            return f"({python(yes)}) if ({python(cond)}) else ({python(no)})"
        expr = expr.replace("||", " or ").replace("&&", " and ")
        return re.sub(r"(?<!/)/(?!/)", "//", re.sub(r"!(?!=)", " not ", expr)).strip()

    return compile(" and ".join(f"({python(group)})" for group in found.groups()), "deepselect.cu", "eval")


def with_constant(text: str, name: str, value: int) -> str:
    return re.sub(rf"(constexpr [\w ]+ {name} = )\d+", rf"\g<1>{value}", text)


def deepselect_configs(*changes: tuple[str, int]) -> list[kernel_config.KernelConfig]:
    """deepselect_config.h as it is, then with each (constant, value) of `changes` changed in its text."""
    text = kernel_config.path("deepselect").read_text()
    return [kernel_config.parse(variant, "deepselect_config.h")
            for variant in (text, *(with_constant(text, name, value) for name, value in changes))]


def kernel_names(config: kernel_config.KernelConfig) -> dict[str, object]:
    """What deepselect.cu's rules read of `config`: its constants, and has_wide over its kWideClasses."""
    return {**config.constants, "has_wide": {row["k_max"] for row in config.tables["kWideClasses"]}.__contains__}


def test_deepselect_model_rebets_by_the_kernels_rule() -> None:
    """The model's `rebets` and re-bet round are deepselect.cu's kRebets and free_rounds' first run,
    evaluated from the kernel's own expressions, on every instantiation it builds (each class narrow and
    wide; kRound is threads * elems for fp32 and bf16 alike, whose elems fill whole 16-byte vectors), for
    the config as it is and with the rule's constants changed: a change in the header changes both sides."""
    src = SOURCES["deepselect"]
    kernel_rebets = cpp_expression(src, r"static constexpr bool kRebets = ([^;]+);")
    kernel_end = cpp_expression(src, r"int begin = 0, end = ([^;]+);")
    rounds = list(range(1, 300))
    seen = set()
    for config in deepselect_configs(("kWideStride", 65536), ("kRebetRounds", 9), ("kRebetRounds", 10),
                                     ("kRebetDiv", 4)):
        for wide, table in ((False, "kClasses"), (True, "kWideClasses")):
            for row in config.tables[table]:
                assert row["elems"] * 2 % 16 == 0, row
                names = {**kernel_names(config), "WIDE": wide, "K_MAX": row["k_max"],
                         "kRound": row["threads"] * row["elems"]}
                rebets = bool(eval(kernel_rebets, names))
                ends = [eval(kernel_end, {**names, "kRebets": rebets, "sp": SimpleNamespace(rounds=r)})
                        for r in rounds]
                cfg = cpu_models.deepselect_config(row["k_max"], config.constants["kWideStride"] - (not wide), config)
                assert (cfg.k_max, cfg.round, cfg.rebets) == (row["k_max"], names["kRound"], rebets), (table, row)
                assert cfg.rebet_round(torch.tensor(rounds)).tolist() == [
                    -1 if end == r else end - 1 for r, end in zip(rounds, ends, strict=True)], (table, row)
                seen.add((table, row["k_max"], rebets))
    assert len({(table, k) for table, k, _ in seen}) < len(seen)  # some variant re-bets by a constant


def test_deepselect_model_takes_the_wide_variant_by_the_kernels_rule() -> None:
    """The model's narrow or wide variant is the one deepselect.cu's launch_class launches, evaluated from
    the kernel's own conditions (its `if constexpr` and the `if` that returns the wide launch), for every
    class and row strides around kWideStride, with the config as it is and with kWideStride changed."""
    kernel_wide = cpp_expression(SOURCES["deepselect"], r"(?s)int launch_class\(.*?if constexpr \((.+?)\) \{"
                                                        r"\s*if \((.+?)\)\s*return launch<T, K_MAX, true>")
    seen = set()
    for config in deepselect_configs(("kWideStride", 65536), ("kWideStride", 4096)):
        stride = config.constants["kWideStride"]
        rows = {(table, row["k_max"]): (row["threads"] // 32, row["elems"], row["b2"])
                for table in ("kClasses", "kWideClasses") for row in config.tables[table]}
        for k_max in (row["k_max"] for row in config.tables["kClasses"]):
            for row_stride in (1, stride // 2, *range(stride - 3, stride + 4), 2 * stride, 163840):
                wide = bool(eval(kernel_wide, {**kernel_names(config), "K_MAX": k_max, "row_stride": row_stride}))
                cfg = cpu_models.deepselect_config(k_max, row_stride, config)
                chosen = rows[("kWideClasses" if wide else "kClasses", k_max)]
                assert (cfg.warps, cfg.elems, cfg.slack) == chosen, (k_max, row_stride, stride)
                assert chosen != rows.get(("kClasses" if wide else "kWideClasses", k_max)), k_max  # told apart
                seen.add((k_max, wide))
    assert len({k for k, _ in seen}) < len(seen)  # both variants of some class were taken


def test_keep_rank_is_the_kernels_float_arithmetic() -> None:
    """deepselect.cu computes mu + kRankSigmas * sqrtf(mu) + kRankExtra in fp32, in that order; so does
    the model (at 512 of 17244 after 2048 both rank 108 where exact maths says 109)."""
    assert "ceilf(mu + kSigmas * sqrtf(mu) + kExtra)" in SOURCES["deepselect"]
    sigmas, extra = (kernel_config.load("deepselect").constants[c] for c in ("kRankSigmas", "kRankExtra"))
    seen = torch.tensor([1, 512, 2048, 4096, 70000, 2048])
    length = torch.tensor([3000, 8192, 8192, 100000, 163840, 17244])
    for top_k in (1, 100, 512, 2048, 4096):
        mu = torch.tensor(float(top_k)) * seen.float() / length.float()
        expected = torch.ceil(mu + float(sigmas) * mu.sqrt() + float(extra)).clamp(max=top_k).to(torch.int64)
        assert torch.equal(cpu_models.keep_rank(top_k, seen, length), expected), top_k
    assert int(cpu_models.keep_rank(512, torch.tensor([2048]), torch.tensor([17244]))[0]) == 108
