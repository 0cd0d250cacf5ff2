"""The kernels' constants, read from the `.cu` sources, against the CPU models' copies in cpu_models.py:
split's plan (grid, chunk, cache, rows, listing sizes, coarse window, 16-bit plan index), DeepSelect's
configuration rules per top_k class and width, its visit-order prime, speculative rank and resolved key
bits, native's bins. The models replay the kernels' decisions, so a constant changed on one side alone
makes them disagree; this test fails first. It also holds the sources to one style of tunable and the
sweep script to variants the sources still have."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from logitreplay.selectors import cpu_models
from logitreplay.selectors.cuda import build

SOURCES = {name: (build.SOURCE_DIR / f"{name}.cu").read_text() for name in build.kernel_names()}
H200_SMS = 132  # the model's plan is an H200's (cpu_models.SPLIT_GRID)


_BINARY: list[dict[str, Callable[[int, int], int]]] = [  # C's precedence, loosest first
    {"||": lambda a, b: int(bool(a) or bool(b))},
    {"&&": lambda a, b: int(bool(a) and bool(b))},
    {"==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b)},
    {"<": lambda a, b: int(a < b), ">": lambda a, b: int(a > b), "<=": lambda a, b: int(a <= b),
     ">=": lambda a, b: int(a >= b)},
    {"<<": lambda a, b: a << b, ">>": lambda a, b: a >> b},
    {"+": lambda a, b: a + b, "-": lambda a, b: a - b},
    {"*": lambda a, b: a * b, "/": lambda a, b: int(a / b), "%": lambda a, b: a % b},
]


def evaluate(expr: str, env: dict[str, int]) -> int:
    """An integer C expression of the sources' constants (literals, names in `env`, arithmetic, shifts,
    comparisons, && || and ?:), evaluated as C evaluates it."""
    toks = re.findall(r"\d+(?=u?\b)|\w+|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%<>?:()]|\S", re.sub(r"(\d)u\b", r"\1", expr))
    pos = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def take() -> str:
        nonlocal pos
        assert pos < len(toks), f"cannot read {expr!r}"
        pos += 1
        return toks[pos - 1]

    def level(i: int) -> int:
        if i == len(_BINARY):
            tok = take()
            if tok == "(":
                v = ternary()
                assert take() == ")", f"cannot read {expr!r}"
                return v
            assert tok.isdigit() or tok in env, f"cannot read {tok!r} in {expr!r}"
            return int(tok) if tok.isdigit() else env[tok]
        v = level(i + 1)
        while (op := peek()) in _BINARY[i]:
            take()
            v = _BINARY[i][op](v, level(i + 1))
        return v

    def ternary() -> int:
        cond = level(0)
        if peek() != "?":
            return cond
        take()
        yes = ternary()
        assert take() == ":", f"cannot read {expr!r}"
        no = ternary()
        return yes if cond else no

    value = ternary()
    assert pos == len(toks), f"cannot read {expr!r}"
    return value


def tunables(src: str) -> dict[str, tuple[str, str]]:
    """Every tunable of a source: constant name -> (override macro, default expression)."""
    return {m[1]: (m[0], m[2]) for m in re.findall(
        r"#ifdef (LR_\w+)\n\s*(?:static )?constexpr [\w ]+? (k\w+) = \1\b[^;]*;\n#else\n(?:\s*//.*\n)*"
        r"\s*(?:static )?constexpr [\w ]+? \2 = ([^;]+?);(?:\s*//.*)?\n#endif", src)}


def constants(src: str) -> dict[str, int]:
    """The source's file-level integer constants (tunables at their defaults), evaluated in order."""
    env: dict[str, int] = {}
    for name, expr in re.findall(r"^constexpr (?:int|long long|uint32_t) (k\w+) = ([^;]+);", src, re.M):
        if "LR_" not in expr:  # an override's line: its default is the #else line
            env[name] = evaluate(expr, env)
    return env


def test_the_evaluator_reads_c_as_c() -> None:
    assert evaluate("WIDE ? (K_MAX <= 512 ? 4 : 3) : K_MAX <= 1024 ? 5 : K_MAX <= 2048 ? 3 : 1",
                    {"WIDE": 0, "K_MAX": 2048}) == 3
    assert evaluate("(127 - 16) << 5", {}) == 3552 and evaluate("7 / 2 + 1u", {}) == 4
    with pytest.raises(AssertionError):
        evaluate("sizeof(T) == 4", {})


def test_every_tunable_has_one_style_and_the_sweep_offers_only_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))  # as the script sees bench/
    deepselect_tune = importlib.import_module("deepselect_tune")

    for name, src in SOURCES.items():
        overrides = set(re.findall(r"#ifn?def (LR_\w+)", src)) - {"LR_WORK_RECORD"}
        assert "#ifndef LR_" not in src, name
        assert overrides == {macro for macro, _ in tunables(src).values()}, name
    for family, variants in deepselect_tune.FAMILIES.items():
        offered = {macro for defines in variants.values() for macro in defines}
        assert offered <= {macro for macro, _ in tunables(SOURCES[family]).values()}, family


def test_split_plan_constants_match_the_model() -> None:
    split = constants(SOURCES["split"])
    assert H200_SMS * split["kBlocksPerSm"] == cpu_models.SPLIT_GRID
    assert split["kCacheBytes"] == cpu_models.SPLIT_CACHE_BYTES
    assert split["kMinChunk"] == cpu_models.SPLIT_MIN_CHUNK
    assert split["kShareDiv"] == cpu_models.SPLIT_SHARE_DIV
    assert split["kSplitRows"] == cpu_models.SPLIT_ROWS
    assert split["kListed"] == cpu_models.SPLIT_LISTED
    assert split["kSlotPairs"] == cpu_models.SPLIT_SLOT_LISTED
    assert split["kWindow"] == cpu_models._SPLIT_WINDOW
    bits = re.search(r"using PlanIndex = uint(\d+)_t;", SOURCES["split"])
    assert bits and 2 ** int(bits[1]) - 1 == cpu_models.SPLIT_PLAN_ITEMS


def test_native_constants_match_the_model() -> None:
    native = constants(SOURCES["native"])
    assert (native["kBins"], native["kFinal"]) == (cpu_models.NATIVE_BINS, cpu_models.NATIVE_FINAL_ITEMS)


DS = SOURCES["deepselect"]


def _ds_classes() -> tuple[list[int], set[int]]:
    """The top_k classes deepselect.cu's launch_for_k dispatches to, and those with a wide variant."""
    body = DS[DS.index("int launch_for_k("):]
    body = body[:body.index("\n}\n")]
    bounded = [int(k) for k in re.findall(r"top_k <= (\d+)\s+\? launch_class<T, \1>", body)]
    classes = [*bounded, int(re.findall(r": launch_class<T, (\d+)>;", body)[-1])]
    wide_max = re.search(r"constexpr bool has_wide\(int k_max\) \{ return k_max <= (\d+); \}", DS)
    assert wide_max, "has_wide"
    return classes, {k for k in classes if k <= int(wide_max[1])}


def test_deepselect_classes_and_configuration_rules_match_the_model() -> None:
    classes, wide = _ds_classes()
    assert tuple(classes) == cpu_models.DS_CLASSES
    assert wide == {k for k in classes if k <= cpu_models.DS_WIDE_MAX_K}
    assert constants(DS)["kWideStride"] == cpu_models.DS_WIDE_STRIDE
    assert (constants(DS)["kRebetRounds"], constants(DS)["kRebetDiv"]) == (cpu_models.DS_REBET_ROUNDS,
                                                                          cpu_models.DS_REBET_DIV)
    config = DS[DS.index("struct Config {"):DS.index("};", DS.index("struct Config {"))]
    rules = tunables(config)
    for k_max in classes:
        for is_wide in sorted({False, k_max in wide}):
            env = {"K_MAX": k_max, "WIDE": int(is_wide)}
            threads, elems, b2 = (evaluate(rules[c][1], env) for c in ("kThreads", "kElems", "kB2"))
            stride = cpu_models.DS_WIDE_STRIDE if is_wide else cpu_models.DS_WIDE_STRIDE - 1
            cfg = cpu_models.deepselect_config(k_max, stride)
            assert (cfg.k_max, cfg.warps, cfg.elems, cfg.slack) == (k_max, threads // 32, elems, b2), env
            assert cfg.cap == k_max + b2 + cfg.round  # kCap = K_MAX + kB2 + kRound


def test_deepselect_prime_rank_margin_and_key_bits_match_the_model() -> None:
    prime = re.search(r"constexpr uint32_t kPermPrime = (\d+)u;", DS)
    assert prime and int(prime[1]) == cpu_models._PERM_PRIME
    margin = re.search(r"ceilf\(mu \+ ([\d.]+)f \* sqrtf\(mu\) \+ ([\d.]+)f\)", DS)
    assert margin, "keep_rank's margin"
    sigmas, extra = float(margin[1]), float(margin[2])
    seen = torch.tensor([1, 512, 2048, 4096, 70000, 2048])
    length = torch.tensor([3000, 8192, 8192, 100000, 163840, 17244])
    for top_k in (1, 100, 512, 2048, 4096):
        # the kernel's float arithmetic: at 512 of 17244 after 2048 it ranks 108 where exact maths says 109
        mu = torch.tensor(float(top_k)) * seen.float() / length.float()
        expected = torch.ceil(mu + sigmas * mu.sqrt() + extra).clamp(max=top_k).to(torch.int64)
        assert torch.equal(cpu_models.keep_rank(top_k, seen, length), expected), top_k
    assert int(cpu_models.keep_rank(512, torch.tensor([2048]), torch.tensor([17244]))[0]) == 108
    for bits, name in ((cpu_models.DS_FIRST_BITS, "kFirstBits"), (cpu_models.DS_KEY_BITS, "kKeyBits")):
        rule = re.search(rf"static constexpr int {name} = sizeof\(T\) == 4 \? (\d+) : (\d+);", DS)
        assert rule and bits == (int(rule[1]), int(rule[2])), name


def test_a_changed_source_constant_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison reads the source: a kernel whose cache or prime changed alone fails it."""
    changed = SOURCES["split"].replace("constexpr int kCacheBytes = 96 << 10;", "constexpr int kCacheBytes = 64 << 10;")
    assert constants(changed)["kCacheBytes"] != cpu_models.SPLIT_CACHE_BYTES
    monkeypatch.setitem(SOURCES, "split", changed)
    with pytest.raises(AssertionError):
        test_split_plan_constants_match_the_model()
