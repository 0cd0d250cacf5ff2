"""staging/parts.sh, which carries a file too large for one GPU run in parts (staging/stage_cudnn.sh,
staging/stage_vllm.sh): the parts reassemble to the same bytes in any order, each from a tree holding only
its own part; a run before the last keeps its part and says which are missing; a damaged part is refused;
and stage_vllm.sh's unpack.sh lays a release of vLLM's libraries out as a staged release, where
bench/fidelity_gpu.sh reads them and bench/peers.py gives every adapter that takes it a column."""

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
