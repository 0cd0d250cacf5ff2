"""The pinned upstream sources: fetched by version and sha256, a skip (never a pass) without the registry."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import upstream_wheels as uw

FAKE = uw.Pin("nothing", "1.0", "nothing-1.0-py3-none-any.whl", "0" * 64)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LOGITREPLAY_TEST_CACHE", str(tmp_path))
    monkeypatch.delenv("LOGITREPLAY_UPSTREAM_REQUIRED", raising=False)
    return tmp_path


def unreachable(pin: uw.Pin, into: Path) -> None:
    raise uw.Unreachable("ERROR: Could not find a version that satisfies the requirement")


def test_unreachable_registry_skips_with_the_reason(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uw, "_pip_download", unreachable)
    with pytest.raises(pytest.skip.Exception, match="nothing-1.0 could not be fetched.*satisfies"):
        uw.require(FAKE)


def test_unreachable_registry_fails_where_upstream_is_required(cache: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uw, "_pip_download", unreachable)
    monkeypatch.setenv("LOGITREPLAY_UPSTREAM_REQUIRED", "1")
    with pytest.raises(pytest.fail.Exception, match="could not be fetched"):
        uw.require(FAKE)


def test_a_file_with_another_sha256_is_refused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def tampered(pin: uw.Pin, into: Path) -> None:
        (into / pin.filename).write_bytes(b"not the pinned wheel")

    monkeypatch.setattr(uw, "_pip_download", tampered)
    with pytest.raises(AssertionError, match="is not the pinned"):
        uw.require(FAKE)
    assert not (cache / "wheels" / FAKE.filename).exists()


def test_the_pinned_vllm_sources_are_extracted_once(vllm_0340_tree: Path) -> None:
    files = uw.source_files(uw.VLLM_0340)
    assert vllm_0340_tree / "vllm" / "model_executor" / "layers" / "sparse_attn_indexer.py" in files
    assert all(f.suffix == ".py" for f in files)
    assert uw.source_tree(uw.VLLM_0340) == vllm_0340_tree


def test_the_pinned_sglang_sources_are_extracted_once(sglang_0523_tree: Path) -> None:
    files = uw.source_files(uw.SGLANG_0523)
    assert sglang_0523_tree / "sglang" / "srt" / "layers" / "attention" / "dsa" / "dsa_indexer.py" in files
    assert all(f.suffix == ".py" for f in files)
