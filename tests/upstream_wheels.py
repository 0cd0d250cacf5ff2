"""The engines' released Python sources, fetched at test time by exact version and sha256.

The capture tests run the plugins inside the real engine modules, and the copy check compares every test
fake against them, so neither may rely on sources kept in this repository (the project holds only code
it wrote). Each pin names one wheel of the package registry; it is downloaded once with pip (the running
interpreter's, through the registry the user's pip is configured for), checked against its sha256, and
its `.py` tree is extracted once, all under a cache outside the repository:
`$LOGITREPLAY_TEST_CACHE`, else `~/.cache/logitreplay-tests`.

Where the registry cannot be reached the tests that need a pin are skipped with the reason (pip's last
line); a wheel whose sha256 differs from its pin fails them. `LOGITREPLAY_UPSTREAM_REQUIRED=1` (set it in
CI, where the registry is reachable) turns the skip into a failure, so a broken network cannot pass a run.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pin:
    """One released wheel: what pip asks the registry for and what the download must hash to."""

    project: str
    version: str
    filename: str
    sha256: str
    # pip's target tags for a platform wheel, so that the same pin is fetched on any test machine;
    # None for a pure-Python (py3-none-any) wheel.
    platform: str | None = None
    abi: str = "abi3"  # the wheel's ABI tag (vLLM builds against the stable ABI, SGLang per CPython)

    @property
    def key(self) -> str:
        return f"{self.project}-{self.version}"


VLLM_0330 = Pin(
    "vllm",
    "0.33.0",
    "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    platform="manylinux_2_28_x86_64",
)
VLLM_0340 = Pin(
    "vllm",
    "0.34.0",
    "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
    platform="manylinux_2_28_x86_64",
)
# SGLang publishes one wheel per CPython; its .py tree is the same in each (the extensions are not used).
SGLANG_0523 = Pin(
    "sglang",
    "0.5.23",
    "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
    "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
    platform="manylinux_2_34_x86_64",
    abi="cp311",
)

PINS: dict[str, Pin] = {pin.key: pin for pin in (VLLM_0330, VLLM_0340, SGLANG_0523)}


class Unreachable(Exception):
    """pip could not fetch a pin (no network, registry down): the tests that need it are skipped."""


def cache_root() -> Path:
    configured = os.environ.get("LOGITREPLAY_TEST_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "logitreplay-tests"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _pip_download(pin: Pin, into: Path) -> None:
    """Fetches exactly `pin.filename` (pip checks the hash too: the requirement carries it)."""
    requirement = into / "requirement.txt"
    requirement.write_text(f"{pin.project}=={pin.version} --hash=sha256:{pin.sha256}\n")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--timeout", "30", "--retries", "2",
               "--dest", str(into), "-r", str(requirement)]
    if pin.platform is not None:
        command += ["--platform", pin.platform, "--implementation", "cp", "--python-version", "3.11",
                    "--abi", pin.abi]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode == 0:
        return
    text = (done.stderr or done.stdout).strip()
    if "DO NOT MATCH THE HASHES" in text:
        raise AssertionError(f"{pin.filename}: the registry's file does not hash to the pinned sha256")
    lines = [line for line in text.splitlines() if line.strip()]
    raise Unreachable(lines[-1] if lines else f"pip exited {done.returncode}")


def wheel(pin: Pin) -> Path:
    """The pinned wheel in the cache, downloaded on first use and checked against its sha256 every time
    it is taken from the cache (a truncated or replaced file is fetched again)."""
    path = cache_root() / "wheels" / pin.filename
    if path.exists() and sha256_of(path) == pin.sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".fetch-") as scratch:
        _pip_download(pin, Path(scratch))
        got = Path(scratch) / pin.filename
        if not got.exists():
            raise AssertionError(f"pip fetched no {pin.filename} for {pin.key}")
        if sha256_of(got) != pin.sha256:
            raise AssertionError(f"{pin.filename}: sha256 {sha256_of(got)} is not the pinned {pin.sha256}")
        os.replace(got, path)
    return path


def source_tree(pin: Pin) -> Path:
    """The directory holding the pin's `.py` files as the wheel lays them out (`vllm/...`), extracted
    once; a `.complete` marker naming the sha256 says the extraction finished."""
    root = cache_root() / "src" / pin.key
    marker = root / ".complete"
    if marker.exists() and marker.read_text().strip() == pin.sha256:
        return root
    path = wheel(pin)
    root.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=root.parent, prefix=f".{pin.key}-"))
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.filename.endswith(".py") and ".dist-info/" not in member.filename:
                    archive.extract(member, scratch)
        (scratch / ".complete").write_text(pin.sha256 + "\n")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(scratch, root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return root


def source_files(pin: Pin) -> list[Path]:
    """Every upstream `.py` file of the pin (for the check that no test fake copies upstream lines)."""
    root = source_tree(pin)
    return sorted(p for p in root.rglob("*.py") if p.is_file())


def require(pin: Pin) -> Path:
    """`source_tree(pin)` for a test: skipped with pip's reason when the registry cannot be reached
    (failed instead under LOGITREPLAY_UPSTREAM_REQUIRED=1)."""
    try:
        return source_tree(pin)
    except Unreachable as unreachable:
        reason = f"{pin.key} could not be fetched from the package registry: {unreachable}"
        if os.environ.get("LOGITREPLAY_UPSTREAM_REQUIRED") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm_0330_tree() -> Path:
    """vLLM 0.33.0's released sources (the directory holding `vllm/`)."""
    return require(VLLM_0330)


@pytest.fixture(scope="session")
def vllm_0340_tree() -> Path:
    """vLLM 0.34.0's released sources (the directory holding `vllm/`)."""
    return require(VLLM_0340)


@pytest.fixture(scope="session")
def sglang_0523_tree() -> Path:
    """SGLang 0.5.23's released sources (the directory holding `sglang/`)."""
    return require(SGLANG_0523)
