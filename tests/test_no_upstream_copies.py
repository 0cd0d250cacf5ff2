"""No file of the project copies the engines' released code (tests/upstream_copies.py says what counts).

Every Python file under logitreplay/, tests/ (the engine fakes of tests/engine_fakes/ and every other
stand-in among them) and bench/ is compared with the released sources of every pinned engine version
(tests/upstream_wheels.py: vLLM 0.33.0 and 0.34.0, SGLang 0.5.23), fetched from the package registry.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import upstream_copies as uc
from tests import upstream_wheels as uw

ROOT = Path(__file__).parents[1]
SCANNED = ("logitreplay", "tests", "bench")

UPSTREAM = """
def rows_of(chunk, shard):
    start = max(chunk.token_start, shard.start)
    end = min(chunk.token_end, shard.stop)
    if start >= end:
        return None
    lo, hi = start - chunk.token_start, end - chunk.token_start
    window_offsets = chunk.cu_seqlen_ks[lo:hi] - chunk.cu_seqlen_ks[lo]
    return lo, hi, window_offsets.to(torch.int32)
"""
COPIED = """
import torch


def rows_of(chunk, shard):
    start = max(chunk.token_start,   shard.start)
    end   = min(chunk.token_end, shard.stop)
    if start >= end:
        return None
    lo, hi = start - chunk.token_start, end - chunk.token_start
    window_offsets = chunk.cu_seqlen_ks[lo:hi] - chunk.cu_seqlen_ks[lo]
    return lo, hi, window_offsets.to(torch.int32)
"""
WRITTEN = '''
import torch


def rows_of(chunk, shard):
    """The chunk's rows inside the shard's window, and their key offsets from the window's first row."""
    first, last = max(chunk.token_start, shard.start), min(chunk.token_end, shard.stop)
    if first >= last:
        return None
    rows = slice(first - chunk.token_start, last - chunk.token_start)
    offsets = chunk.cu_seqlen_ks[rows] - chunk.cu_seqlen_ks[rows.start]
    return rows.start, rows.stop, offsets.int()
'''


@pytest.fixture(scope="session")
def upstream() -> dict[str, list[str]]:
    """Every non-trivial line of every pinned release, with the files that have it."""
    files = []
    for pin in (uw.VLLM_0330, uw.VLLM_0340, uw.SGLANG_0523):
        tree = uw.require(pin)
        files += [(f"{pin.key}/{p.relative_to(tree)}", p.read_text(errors="replace")) for p in uw.source_files(pin)]
    return uc.index(files)


def test_a_fake_written_from_the_facts_passes_and_a_copied_function_fails() -> None:
    upstream = uc.index([("vllm-0.33.0/vllm/x.py", UPSTREAM)])
    copied = uc.shared(Path("fake.py"), COPIED, upstream)
    assert uc.copied(copied)
    assert [(f.line, f.upstream) for f in copied][:2] == [(6, "vllm-0.33.0/vllm/x.py"), (7, "vllm-0.33.0/vllm/x.py")]
    assert str(copied[0]).startswith("fake.py:6: 'start = max(chunk.token_start, shard.start)' (also in vllm-0.33.0")
    written = uc.shared(Path("fake.py"), WRITTEN, upstream)
    assert not uc.copied(written)
    # its import and signature are the facts it shares: not counted
    assert all(f.line > 5 for f in written)


def test_idioms_found_in_many_upstream_files_do_not_count() -> None:
    idiom = "deadline = time.monotonic() + 30\n"
    upstream = uc.index([(f"u{i}.py", idiom) for i in range(uc.COMMON)])
    assert uc.shared(Path("mine.py"), idiom, upstream) == []


@pytest.mark.slow
def test_no_file_of_the_project_copies_released_engine_code(upstream: dict[str, list[str]]) -> None:
    failures = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT)
            found = uc.shared(relative, path.read_text(errors="replace"), upstream)
            if not uc.copied(found):
                continue
            failures.append(
                f"{relative}: {len(found)} lines identical to released engine code:\n  "
                + "\n  ".join(str(f) for f in found[:12]))
    assert not failures, "\n".join(failures)
