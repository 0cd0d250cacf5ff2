"""staging/parts.sh, which carries a file too large for one GPU run in parts (staging/stage_cudnn.sh,
staging/stage_vllm.sh): the parts reassemble to the same bytes in any order, each from a tree holding only
its own part; a run before the last keeps its part and says which are missing; a damaged part is refused;
and stage_vllm.sh's unpack.sh lays a release of vLLM's libraries out as a staged release, where
bench/fidelity_gpu.sh reads them and bench/peers.py gives every adapter that takes it a column, and
refuses a folder that resolves to / (as every unpack.sh does, through parts.sh's unpack_part)."""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from logitreplay.selectors.upstream import catalog

STAGING = Path(__file__).resolve().parents[1] / "staging"
pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in ("bash", "split", "sha256sum", "numfmt", "tar")),
                                reason="needs bash and coreutils")


def sh(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *map(str, args)], cwd=cwd, capture_output=True, text=True)


def one_part_tree(parts: Path, n: int, root: Path) -> Path:
    """A tree that holds part n only, as one GPU run receives it."""
    tree = root / f"run{n}"
    shutil.copytree(parts / str(n), tree / "parts" / str(n))
    return tree / "parts" / str(n)


def test_parts_reassemble_byte_identical_in_any_order(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    (tmp_path / "blob.bin").write_bytes(data)
    (tmp_path / "extra").write_text("note 0123  kept for the payload\n")
    cut = sh(STAGING / "parts.sh", "cut", tmp_path / "blob.bin", tmp_path / "parts", "4K", tmp_path / "extra")
    assert cut.returncode == 0, cut.stderr
    assert cut.stdout.strip() == "3"
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["1", "2", "3"]
    sums = (tmp_path / "parts" / "1" / "SHA256SUMS").read_text()
    assert f"whole {hashlib.sha256(data).hexdigest()}  blob.bin" in sums and sums.endswith("kept for the payload\n")
    assert all((tmp_path / "parts" / str(n) / f"blob.bin.part{n - 1}").stat().st_size <= 4096 for n in (1, 2, 3))

    host = tmp_path / "host"
    for n, missing in ((3, "blob.bin.part0 blob.bin.part1"), (1, "blob.bin.part1")):
        here = one_part_tree(tmp_path / "parts", n, tmp_path)
        got = sh(here / "parts.sh", "join", here, host)
        assert got.returncode == 10 and f"missing: {missing})" in got.stdout, got
        assert not (host / "blob.bin").exists()
    here = one_part_tree(tmp_path / "parts", 2, tmp_path)
    got = sh(here / "parts.sh", "join", here, host)
    assert got.returncode == 0, got
    assert (host / "blob.bin").read_bytes() == data
    assert not (host / "parts").exists()
    again = sh(here / "parts.sh", "join", here, host)
    assert again.returncode == 0 and "already reassembled" in again.stdout


def test_a_damaged_part_is_refused(tmp_path: Path) -> None:
    (tmp_path / "blob.bin").write_bytes(os.urandom(9000))
    assert sh(STAGING / "parts.sh", "cut", tmp_path / "blob.bin", tmp_path / "parts", "4K").returncode == 0
    part = tmp_path / "parts" / "2" / "blob.bin.part1"
    raw = bytearray(part.read_bytes())
    raw[5] ^= 0xFF
    part.write_bytes(bytes(raw))
    got = sh(tmp_path / "parts" / "2" / "parts.sh", "join", tmp_path / "parts" / "2", tmp_path / "host")
    assert got.returncode == 1 and "is damaged" in got.stderr
    assert not (tmp_path / "host" / "parts" / "blob.bin.part1").exists()


def test_many_parts_keep_their_order(tmp_path: Path) -> None:
    data = os.urandom(12_000)
    (tmp_path / "b").write_bytes(data)
    assert sh(STAGING / "parts.sh", "cut", tmp_path / "b", tmp_path / "parts", "1000").stdout.strip() == "12"
    assert (tmp_path / "parts" / "12" / "b.part11").is_file()  # two-digit suffixes past ten parts
    for n in range(12, 0, -1):
        got = sh(tmp_path / "parts" / str(n) / "parts.sh", "join", tmp_path / "parts" / str(n), tmp_path / "host")
        assert got.returncode == (0 if n == 1 else 10), got
    assert (tmp_path / "host" / "b").read_bytes() == data


@pytest.mark.skipif(shutil.which("xz") is None or shutil.which("git") is None, reason="needs xz and git")
def test_stage_vllm_lays_out_a_staged_release_where_fidelity_and_the_peers_read_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "staging").mkdir(parents=True)
    for script in ("parts.sh", "stage_vllm.sh"):
        shutil.copy(STAGING / script, repo / "staging" / script)
    assert subprocess.run(["git", "init", "-q", str(repo)]).returncode == 0
    libs = {"_C_stable_libtorch.abi3.so": os.urandom(3 << 20), "_deepselect_C.abi3.so": os.urandom(1 << 19)}
    (repo / ".vllm").mkdir()
    for name, data in libs.items():
        (repo / ".vllm" / f"{name}.xz").write_bytes(lzma.compress(data, preset=0))
    (repo / ".vllm" / "VERSION").write_text("vllm==0.34.0\n")
    staged = subprocess.run(["bash", "staging/stage_vllm.sh"], cwd=repo, capture_output=True, text=True,
                            env={**os.environ, "PART_MIB": "2", "DEST": ".vllm-parts-0.34.0"})
    assert staged.returncode == 0, staged.stderr
    parts = repo / ".vllm-parts-0.34.0"
    assert sorted(p.name for p in parts.iterdir()) == ["1", "2", "MANIFEST.txt"]
    manifest = (parts / "MANIFEST.txt").read_text()
    assert "bash .vllm-parts-0.34.0/2/unpack.sh && GPU_TESTS=none bash bench/fidelity_gpu.sh" in manifest
    assert "/tmp/staged/vllm-0.34.0" in manifest

    host = tmp_path / "staged" / "vllm-0.34.0"
    for n in (1, 2):  # two runs, each with its own part only
        tree = tmp_path / f"run{n}"
        shutil.copytree(parts / str(n), tree / ".vllm-parts" / str(n))
        got = sh(f".vllm-parts/{n}/unpack.sh", host, cwd=tree)
        assert got.returncode == 0, got.stderr
        assert ("missing: vllm.tar.part1" in got.stdout) == (n == 1)
        assert not (host / "vllm-0.34.0.dist-info").exists() or n == 2  # a release only once it is whole
    assert sorted(p.name for p in host.iterdir()) == ["VERSION", "vllm", "vllm-0.34.0.dist-info"]
    assert sorted(p.name for p in (host / "vllm").iterdir()) == sorted(libs)  # no __init__.py: as vLLM lays them
    for name, data in libs.items():
        assert (host / "vllm" / name).read_bytes() == data
    assert "Version: 0.34.0" in (host / "vllm-0.34.0.dist-info" / "METADATA").read_text()
    again = sh(tree / ".vllm-parts" / "2" / "unpack.sh", host)
    assert again.returncode == 0 and "already unpacked" in again.stdout
    root = "/".join([str(host), *[".."] * len(host.parts)])  # a DIR that resolves to /
    refused = sh(tree / ".vllm-parts" / "2" / "unpack.sh", root)
    assert refused.returncode == 1 and refused.stderr == "unpack.sh: refusing to unpack into /\n", refused
    columns = catalog.columns([str(host)])
    assert f"vllm-native@{host}" in columns and f"vllm034-auto@{host}" in columns
    assert f"vllm-auto@{host}" not in columns  # 0.33's choice, which 0.34 changed


def test_name_releases_writes_the_metadata_a_trimmed_package_lacks(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text('__version__ = "0.7.2.post1"\n')
    (site / "sgl_kernel").mkdir()
    (site / "sgl_kernel" / "__init__.py").write_text('raise ImportError("built for another torch")\n')
    script = STAGING / "name_releases.py"
    env = {**os.environ, "PYTHONPATH": str(STAGING.parent)}
    got = subprocess.run([sys.executable, str(script), str(site)], capture_output=True, text=True, env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.splitlines() == ["flashinfer-python: 0.7.2.post1",
                                       "sglang-kernel: not named (ImportError on import)"]
    assert "Version: 0.7.2.post1" in (site / "flashinfer_python-0.7.2.post1.dist-info" / "METADATA").read_text()
    again = subprocess.run([sys.executable, str(script), str(site)], capture_output=True, text=True, env=env)
    assert "flashinfer-python: 0.7.2.post1 (named already)" in again.stdout
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "absent")], capture_output=True, text=True,
                         env=env)
    assert bad.returncode == 1 and bad.stderr.startswith("usage:")


# ------------------------------------------------------------------------------ stage_flashinfer.sh

FI_DEPS = {"pynvml": "nvidia_ml_py", "requests": "requests", "urllib3": "urllib3", "idna": "idna",
           "charset_normalizer": "charset_normalizer", "certifi": "certifi", "packaging": "packaging"}


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, str]) -> Path:
    """A minimal py3-none-any wheel pip can install: the files, METADATA, WHEEL and RECORD."""
    import zipfile

    info = f"{dist}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{name},,\n" for name in [*files, f"{info}/RECORD"])
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def fake_flashinfer_wheel(folder: Path, version: str) -> Path:
    """A stand-in flashinfer-python wheel laid out as the facts the script reads say: the top-k JIT
    spec's sources named in jit/topk.py, the AOT location in jit/env.py, the module's entry points looked
    up in topk.py; plus files the trim must drop (other modules' sources) and keep (non-source data)."""
    return make_wheel(folder, "flashinfer_python", version, {
        "flashinfer/__init__.py": f"__version__ = {version!r}\n",
        "flashinfer/topk.py": "def f(module):\n    module.alpha(1)\n    return module.beta\n",
        "flashinfer/jit/__init__.py": "",
        "flashinfer/jit/topk.py": 'SOURCES = [FLASHINFER_CSRC_DIR / "a.cu", FLASHINFER_CSRC_DIR / "b.cu"]\n',
        "flashinfer/jit/env.py": 'AOT = _package_root / "data" / "aot"\n'
                                 'PATH = FLASHINFER_AOT_DIR / module_name / f"{module_name}.so"\n',
        "flashinfer/other/kernel.cu": "// another module's source\n",
        "flashinfer/other/config.json": "{}\n",
        "flashinfer/data/csrc/a.cu": '#include "a.h"\n#include <curand.h>\n',
        "flashinfer/data/csrc/b.cu": "\n",
        "flashinfer/data/csrc/a.h": "\n",
        "flashinfer/data/csrc/unrelated.cu": "\n",
        "flashinfer/data/include/flashinfer/x.cuh": "\n",
        "flashinfer/data/cccl/cub/y.cuh": "\n",
        "flashinfer/data/spdlog/include/z.h": "\n",
        "flashinfer/data/cutlass/include/big.h": "\n",
    })


def fake_module(path: Path, exports: list[str]) -> bytes:
    """A shared library exporting `__tvm_ffi_NAME` for each name, as FlashInfer's tvm-ffi module does."""
    src = path.with_suffix(".c")
    src.write_text("".join(f"int __tvm_ffi_{n}(void) {{ return 0; }}\n" for n in exports))
    assert subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), str(src)]).returncode == 0
    return path.read_bytes()


def flashinfer_repo(tmp_path: Path, version: str) -> tuple[Path, dict[str, str]]:
    """A repository holding the staging scripts, with its own wheel table for the stand-in wheels."""
    repo = tmp_path / "repo"
    (repo / "staging").mkdir(parents=True)
    for script in ("parts.sh", "stage_flashinfer.sh"):
        shutil.copy(STAGING / script, repo / "staging" / script)
    assert subprocess.run(["git", "init", "-q", str(repo)]).returncode == 0
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    made = [fake_flashinfer_wheel(wheels, version)]
    made += [make_wheel(wheels, dist, "1.0", {f"{module}.py": ""}) for module, dist in FI_DEPS.items()]
    (repo / "staging" / "flashinfer.sha256").write_text(
        "".join(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in made))
    env = {**os.environ, "STAGING_CACHE": str(tmp_path / "cache"), "FLASHINFER_WHEELS": str(wheels)}
    return repo, env


def test_stage_flashinfer_refuses_an_unknown_release_or_a_missing_prebuilt_module(tmp_path: Path) -> None:
    repo, env = flashinfer_repo(tmp_path, "9.9.9")
    for args, said in ((["0.7.99"], "FlashInfer 0.7.99 is not a release this script knows "
                                    "(staging/flashinfer.sha256 lists: 9.9.9)"),
                       (["9.9.9", "extra"], "usage: bash staging/stage_flashinfer.sh [VERSION]")):
        got = subprocess.run(["bash", "staging/stage_flashinfer.sh", *args], cwd=repo, capture_output=True,
                             text=True, env=env)
        assert got.returncode == 2 and got.stderr.strip() == f"stage_flashinfer: {said}", got
    assert not (tmp_path / "cache").exists() and not list(repo.glob(".flashinfer-*"))
    missing = subprocess.run(["bash", "staging/stage_flashinfer.sh", "9.9.9"], cwd=repo, capture_output=True, text=True,
                             env={**env, "PREBUILT": str(tmp_path / "none.so.xz")})
    assert missing.returncode == 1 and missing.stderr.endswith(f"no prebuilt module {tmp_path}/none.so.xz\n")
    assert not list(repo.glob(".flashinfer-*"))


@pytest.mark.slow
@pytest.mark.skipif(any(shutil.which(t) is None for t in ("xz", "git", "cc", "nm", "unzip")),
                    reason="needs xz, git, cc, nm and unzip")
def test_stage_flashinfer_packs_a_prebuilt_module_as_a_staged_release(tmp_path: Path) -> None:
    import sys

    repo, env = flashinfer_repo(tmp_path, "9.9.9")
    cache = tmp_path / "cache" / "flashinfer-9.9.9"
    cache.mkdir(parents=True)
    prebuilt = cache / "flashinfer-9.9.9-topk-sm90a.so.xz"
    prebuilt.write_bytes(lzma.compress(fake_module(tmp_path / "short.so", ["alpha"])))
    short = subprocess.run(["bash", "staging/stage_flashinfer.sh", "9.9.9"], cwd=repo, capture_output=True,
                           text=True, env=env)
    assert short.returncode == 1 and "exports no tvm-ffi entry point for: beta" in short.stderr, short
    module = fake_module(tmp_path / "topk.so", ["alpha", "beta", "gamma"])
    prebuilt.write_bytes(lzma.compress(module))  # a module in the cache: nothing is built
    staged = subprocess.run(["bash", "staging/stage_flashinfer.sh", "9.9.9"], cwd=repo, capture_output=True,
                            text=True, env=env)
    assert staged.returncode == 0, staged.stderr
    dest = repo / ".flashinfer-9.9.9"
    assert sorted(p.name for p in dest.iterdir()) == ["1", "MANIFEST.txt"]
    assert "/.flashinfer-9.9.9/" in (repo / ".git" / "info" / "exclude").read_text()
    assert "module sources: a.cu b.cu" in (dest / "MANIFEST.txt").read_text()

    # On the host: a tree holding the part only; every fallback module but pynvml importable there.
    tree = tmp_path / "run1"
    shutil.copytree(dest / "1", tree / ".flashinfer-9.9.9" / "1")
    present = tmp_path / "host-site"
    present.mkdir()
    for name in [*FI_DEPS, "tvm_ffi"]:  # tvm_ffi: as after .peers is unpacked, so the import is checked
        if name != "pynvml":
            (present / f"{name}.py").write_text("")
    host = {**os.environ, "FLASHINFER_PYTHON": sys.executable, "PYTHONPATH": str(present),
            "STAGED": str(tmp_path / "staged")}
    got = subprocess.run(["bash", ".flashinfer-9.9.9/1/unpack.sh"], cwd=tree, capture_output=True, text=True, env=host)
    assert got.returncode == 0 and "fallback wheels installed: 1; import checked" in got.stdout, got
    rel = tmp_path / "staged" / "flashinfer-9.9.9"
    assert (rel / "flashinfer" / "data" / "aot" / "topk" / "topk.so").read_bytes() == module
    kept = {str(p.relative_to(rel / "flashinfer")) for p in (rel / "flashinfer").rglob("*") if p.is_file()}
    assert kept == {"__init__.py", "topk.py", "jit/__init__.py", "jit/topk.py", "jit/env.py", "other/config.json",
                    "data/csrc/a.cu", "data/csrc/b.cu", "data/csrc/a.h", "data/include/flashinfer/x.cuh",
                    "data/cccl/cub/y.cuh", "data/spdlog/include/z.h", "data/aot/topk/topk.so"}
    assert (rel / "flashinfer" / "data" / "cutlass" / "include").is_dir()
    assert "Version: 9.9.9" in (rel / "flashinfer_python-9.9.9.dist-info" / "METADATA").read_text()
    assert (rel / "pynvml.py").is_file() and not (rel / "requests.py").exists()  # only what was missing
    assert sorted(p.name for p in rel.iterdir()) == [
        "flashinfer", "flashinfer_python-9.9.9.dist-info", "nvidia_ml_py-1.0.dist-info", "pynvml.py"]
    again = subprocess.run(["bash", ".flashinfer-9.9.9/1/unpack.sh"], cwd=tree, capture_output=True, text=True,
                           env=host)
    assert again.returncode == 0 and "already unpacked" in again.stdout
