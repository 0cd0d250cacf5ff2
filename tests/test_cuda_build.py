"""The kernel build without a GPU: exact-architecture targets, the cache key, the cache location, atomic
cached builds, and errors that say what to do. The compile test runs wherever nvcc is installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from logitreplay.archive import Case
from logitreplay.cli import main
from logitreplay.selectors.cuda import build
from logitreplay.selectors.cuda.kernels import NativeCuda

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
    for f in build.SOURCE_DIR.glob("*.cu*"):
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path)
    key = build.cache_key("native", "sm_90a", "13.0.88")
    assert build.cache_key("native", "sm_90a", "13.0.88") == key
    assert build.cache_key("native", "sm_100a", "13.0.88") != key
    assert build.cache_key("native", "sm_90a", "13.1.0") != key
    assert build.cache_key("native", "sm_90a", "13.0.88", build.FLAGS + ("-G",)) != key
    header = tmp_path / "common.cuh"
    header.write_text(header.read_text() + "\n// changed\n")
    assert build.cache_key("native", "sm_90a", "13.0.88") != key


def test_unknown_kernel_is_named() -> None:
    with pytest.raises(build.BuildError, match="kernel 'nope': no nope.cu .*bundled kernels: .*native"):
        build.sources("nope")


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


@needs_nvcc
@pytest.mark.slow
def test_every_bundled_kernel_compiles_and_is_then_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOGITREPLAY_CACHE", str(tmp_path))
    res = CliRunner().invoke(main, ["build-kernels", "--arch", "sm_90a", "--json"])
    assert res.exit_code == 0, res.output
    libs = sorted((tmp_path / "kernels").glob("*.so"))
    assert [p.name.split("-")[0] for p in libs] == build.kernel_names()
    assert not list((tmp_path / "kernels").glob("*.tmp"))  # built under a temporary name, then renamed

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("nvcc ran again for a cached kernel")

    build.toolchain()  # cached per process: a cached build needs no compiler call at all
    monkeypatch.setattr(subprocess, "run", no_compiler)
    assert build.build("native", "sm_90a") in libs
