"""The kernel build without a GPU: exact-architecture targets, the cache key, the cache location, atomic
cached builds, errors that say what to do, and the Python binding table against the C header it
restates. The compile test runs wherever nvcc is installed."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Case
from logitreplay.cli import main
from logitreplay.selectors import provenance
from logitreplay.selectors.cuda import abi, build
from logitreplay.selectors.cuda.kernels import NativeCuda
from logitreplay.selectors.upstream import loading

TC = build.Toolchain(Path("/opt/cuda/bin/nvcc"), "13.0.88", ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100"))


@pytest.mark.parametrize(("cc", "arch"), [((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((8, 6), "sm_86"),
                                          ((12, 0), "sm_120a")])
def test_exact_architecture_per_compute_capability(cc: tuple[int, int], arch: str) -> None:
    assert build.arch_for(cc) == arch


def test_gencode_names_the_arch_specific_target() -> None:
    assert build.gencode("sm_90a") == "-gencode=arch=compute_90a,code=sm_90a"


def test_unsupported_architecture_says_what_to_do() -> None:
    build.check_arch("sm_90a", TC)
    with pytest.raises(build.BuildError, match=r"cannot build for sm_50 .*set CUDA_HOME"):
        build.check_arch("sm_50", TC)
    with pytest.raises(build.BuildError, match="expected sm_<major><minor>"):
        build.check_arch("hopper", TC)


def test_missing_nvcc_says_set_cuda_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(build, "DEFAULT_NVCC", tmp_path / "nvcc")
    with pytest.raises(build.BuildError, match="nvcc not found: .*set CUDA_HOME"):
        build.find_nvcc()


def test_nvcc_version_is_parsed() -> None:
    text = "Cuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0.r13.0/compiler.36424714_0"
    assert build.parse_nvcc_version(text) == "13.0.88"
    with pytest.raises(build.BuildError):
        build.parse_nvcc_version("something else")


def test_cache_location_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("LOGITREPLAY_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert build.cache_dir() == tmp_path / "xdg" / "logitreplay"
    monkeypatch.setenv("LOGITREPLAY_CACHE", str(tmp_path / "mine"))
    assert build.cache_dir() == tmp_path / "mine"


def test_cache_key_covers_sources_headers_flags_compiler_and_arch(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    for f in [*build.SOURCE_DIR.glob("*.cu*"), *build.SOURCE_DIR.glob("*.h")]:
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path)
    key = build.cache_key("native", "sm_90a", "13.0.88")
    assert build.cache_key("native", "sm_90a", "13.0.88") == key
    assert build.cache_key("native", "sm_100a", "13.0.88") != key
    assert build.cache_key("native", "sm_90a", "13.1.0") != key
    assert build.cache_key("native", "sm_90a", "13.0.88", build.FLAGS + ("-G",)) != key
    for header in (tmp_path / "common.cuh", tmp_path / "topk_api.h", tmp_path / "native_config.h"):
        header.write_text(header.read_text() + "\n// changed\n")
        assert build.cache_key("native", "sm_90a", "13.0.88") != key
        key = build.cache_key("native", "sm_90a", "13.0.88")


def test_a_config_change_is_a_kernel_change(tmp_path: Path) -> None:
    """A kernel's config (cuda/<kernel>_config.h) is part of its sources: its cache key and the digests a
    replay records, on CUDA and on CPU (whose models read it), all change with it."""
    base = tmp_path / "selectors"
    shutil.copytree(build.SOURCE_DIR, base / "cuda")
    for f in provenance.CPU_MODELS:
        shutil.copy(build.SOURCE_DIR.parent / f, base / f)
    before = {kind: provenance.kernel_sources(kind, base) for kind in ("cuda", "cpu")}
    config = base / "cuda" / "deepselect_config.h"
    config.write_text(config.read_text().replace("kRebetRounds = 16;", "kRebetRounds = 17;"))
    for kind in ("cuda", "cpu"):
        after = provenance.kernel_sources(kind, base)
        assert after["deepselect"] != before[kind]["deepselect"], kind
        assert after["split"] == before[kind]["split"] or kind == "cuda"  # CUDA digests cover every header


def test_unknown_kernel_is_named() -> None:
    with pytest.raises(build.BuildError, match="kernel 'nope': no nope.cu .*bundled kernels: .*native"):
        build.sources("nope")


API_HEADER = (build.SOURCE_DIR / "topk_api.h").read_text()
C_TYPES = {"const void*": ctypes.c_void_p, "void*": ctypes.c_void_p, "const int*": ctypes.c_void_p,
           "int*": ctypes.c_void_p, "cudaStream_t": ctypes.c_void_p, "int": ctypes.c_int,
           "long long": ctypes.c_longlong}


def _header_prototypes() -> dict[str, abi.Signature]:
    """The entry points of LR_TOPK_ENTRY_POINTS in topk_api.h, as the binding table would state them."""
    macro = re.search(r"#define LR_TOPK_ENTRY_POINTS\(family\)((?:.*\\\n)*.*)", API_HEADER)
    assert macro, "topk_api.h defines LR_TOPK_ENTRY_POINTS(family)"
    body = " ".join(macro.group(1).replace("\\\n", " ").split())
    found = {}
    for ret, entry, params in re.findall(r"LR_EXPORT (.+?) lr_##family##_(\w+)\((.*?)\)", body):
        args = []
        for param in params.split(","):
            typed = re.fullmatch(r"(.+?)\s*(\w+)", param.strip())
            assert typed, f"lr_<family>_{entry}: unnamed parameter {param!r}"
            args.append((typed.group(2), C_TYPES[typed.group(1)]))
        found[entry] = abi.Signature(C_TYPES[ret], tuple(args))
    return found


def test_binding_table_matches_the_header_prototypes() -> None:
    assert _header_prototypes() == abi.ENTRY_POINTS


def test_header_declares_every_bundled_family() -> None:
    assert sorted(re.findall(r"^LR_TOPK_ENTRY_POINTS\((\w+)\);", API_HEADER, re.M)) == build.kernel_names()


def test_return_codes_dtypes_and_status_match_the_header() -> None:
    constants = re.findall(r"\b(LR_\w+) = (\d+)u?\b", API_HEADER)
    assert {name for name, _ in constants} >= {"LR_OK", "LR_EINVAL", "LR_EWORKSPACE", "LR_ELAUNCH", "LR_F32",
                                               "LR_BF16", "LR_STATUS_NAN"}
    for name, value in constants:
        assert getattr(abi, name) == int(value), name
    status = re.search(r"static_assert\(sizeof\(LrStatus\) == (\d+)", API_HEADER)
    assert status and int(status.group(1)) == abi.STATUS_BYTES
    work = re.search(r"struct LrWork \{\n  uint32_t counters\[(\d+)\];\n\};\nstatic_assert\(sizeof\(LrWork\) == (\d+)",
                     API_HEADER)
    assert work and (int(work[1]), int(work[2])) == (abi.WORK_COUNTERS, abi.WORK_BYTES)
    assert set(abi.MESSAGES) == {int(v) for n, v in constants if n.startswith("LR_E")}
    assert abi.describe(abi.LR_EWORKSPACE) == "workspace too small" and abi.describe(9) == "error 9"


def test_typed_arguments_follow_the_table() -> None:
    args = abi.typed("workspace_bytes", 4, 100, 8)
    assert [type(a) for a in args] == [ctypes.c_int] * 3 and [a.value for a in args] == [4, 100, 8]
    with pytest.raises(TypeError, match="takes 1 arguments"):
        abi.typed("max_top_k", 0, 1)


def test_library_without_the_entry_points_is_a_build_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build, "load", lambda name, arch=None, extra=(): types.SimpleNamespace(_name="/cache/fake.so"))
    abi.entry_points.cache_clear()
    try:
        with pytest.raises(build.BuildError, match="kernel native: /cache/fake.so lacks .*topk_api.h"):
            abi.entry_points("native", "sm_90a")
    finally:
        abi.entry_points.cache_clear()


def test_supports_explains_cpu_device() -> None:
    case = Case.from_rows("c", torch.zeros(4), [0], [4], top_k=2, cols=4)
    assert "needs a CUDA device" in (NativeCuda().supports(case, torch.device("cpu")) or "")


def test_build_kernels_without_gpu_or_arch_is_one_line_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    res = CliRunner().invoke(main, ["build-kernels"])
    assert res.exit_code == 1
    assert "build-kernels --arch sm_90a" in res.output and "Traceback" not in res.output


needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None and not build.DEFAULT_NVCC.exists(),
                                reason="needs nvcc")


@dataclass
class Built:
    """`build-kernels --arch sm_90a --json` into an empty cache: its result, and the cache's files then."""

    cache: Path
    exit_code: int
    output: str
    files: list[Path]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """Every bundled kernel's default sm_90a build, compiled once into a cache of its own; the tests of
    one library or of the variant builds (work, det) read their default builds from it, so that each
    compiles only what it is about."""
    cache = tmp_path_factory.mktemp("kernel-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOGITREPLAY_CACHE", str(cache))
        res = CliRunner().invoke(main, ["build-kernels", "--arch", "sm_90a", "--json"])
    return Built(cache, res.exit_code, res.output, sorted((cache / "kernels").glob("*")))


@needs_nvcc
@pytest.mark.slow
def test_every_bundled_kernel_compiles_and_is_then_cached(monkeypatch: pytest.MonkeyPatch, built: Built) -> None:
    assert built.exit_code == 0, built.output
    libs = [p for p in built.files if p.suffix == ".so"]
    assert [p.name.split("-")[0] for p in libs] == build.kernel_names()
    assert not [p for p in built.files if p.suffix == ".tmp"]  # built under a temporary name, then renamed
    monkeypatch.setenv("LOGITREPLAY_CACHE", str(built.cache))

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("nvcc ran again for a cached kernel")

    build.toolchain()  # cached per process: a cached build needs no compiler call at all
    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert build.build("native", "sm_90a") in libs


@needs_nvcc
@pytest.mark.slow
def test_no_code_for_this_gpu_is_read_from_a_real_library(monkeypatch: pytest.MonkeyPatch, built: Built) -> None:
    """The architecture probe that makes an adapter say "no sm_100 code in ..." (loading.missing_arch),
    on a library nvcc really built for sm_90a: its fatbin holds one sm_90 cubin, which runs on 9.0 only."""
    monkeypatch.setenv("LOGITREPLAY_CACHE", str(built.cache))
    lib = build.build("native", "sm_90a")
    assert loading.fatbin_archs(str(lib)) == {("cubin", 90)}
    loaded = loading.Loaded(str(lib), str(lib))
    assert loading.missing_arch(loaded, "native", (9, 0)) is None
    assert loading.missing_arch(loaded, "native", (10, 0)) == "no sm_100 code in native (it has sm_90)"
    assert loading.missing_arch(loaded, "native", (8, 0)) == "no sm_80 code in native (it has sm_90)"


@needs_nvcc
@pytest.mark.slow
def test_the_work_build_is_a_library_of_its_own(monkeypatch: pytest.MonkeyPatch, built: Built) -> None:
    """The work record's build (WORK_FLAGS) is cached apart from the default one, and its workspace has
    one record per row after the default's; the default build's has none."""
    monkeypatch.setenv("LOGITREPLAY_CACHE", str(built.cache))
    abi.entry_points.cache_clear()
    try:
        plain = abi.entry_points("native", "sm_90a")
        work = abi.entry_points("native", "sm_90a", build.WORK_FLAGS)
        assert build.build("native", "sm_90a") != build.build("native", "sm_90a", build.WORK_FLAGS)
        assert int(plain["workspace_bytes"](64, 100, 8, 0)) == abi.STATUS_BYTES
        assert int(work["workspace_bytes"](64, 100, 8, 0)) == abi.STATUS_BYTES + 64 * abi.WORK_BYTES
    finally:
        abi.entry_points.cache_clear()


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("family", ["native", "deepselect", "split"])
def test_the_deterministic_build_is_a_library_of_its_own(monkeypatch: pytest.MonkeyPatch, built: Built,
                                                         family: str) -> None:
    """The `-det` selectors' build (DET_FLAGS) compiles, is cached apart from the default one under a name
    that says so, and states its own top_k bound (split sorts a row's indices in its key cache)."""
    monkeypatch.setenv("LOGITREPLAY_CACHE", str(built.cache))
    abi.entry_points.cache_clear()
    try:
        plain = build.build(family, "sm_90a")
        det = build.build(family, "sm_90a", build.DET_FLAGS)
        assert plain != det and det.name.startswith(f"{family}-det-sm_90a-")
        bound = int(abi.entry_points(family, "sm_90a", build.DET_FLAGS)["max_top_k"](abi.LR_F32))
        assert bound == {"native": 16384, "deepselect": 4096, "split": 96 * 1024 // 4}[family]
    finally:
        abi.entry_points.cache_clear()
