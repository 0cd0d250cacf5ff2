"""Issue 40, finding 1: a damaged chunk is never decompressed before it proved itself (a CRC-32C of the
stored bytes in archives written now; a Blosc header that states exactly the chunk's stored and decoded
sizes in every archive), in every reader. A chunk cut short as `truncate -s 1000` cuts it once took the
replay worker down with SIGSEGV and named the case `#0`; now every reader names the case by its id in
one line, and the other cases are still replayed, inspected and exported."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numcodecs
import numpy as np
import pytest
from click.testing import CliRunner, Result

from logitreplay.archive import Archive, Case, store
from logitreplay.cli import main
from logitreplay.errors import ArchiveError
from logitreplay.replay import isolate
from logitreplay.replay.results import CaseResult

GOOD, BAD = "good-c1024-r64-k8", "bad-c1024-r64-k8"


def _case(case_id: str, seed: int) -> Case:
    logits = np.random.default_rng(seed).standard_normal((64, 1024)).astype(np.float32)
    return Case.from_matrix(case_id, logits, np.zeros(64, np.int32), np.full(64, 1024, np.int32), top_k=8)


def _archive(tmp_path: Path, legacy: bool, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two cases; `legacy`: written as archives were before chunk checksums (Blosc alone)."""
    if legacy:
        from zarr.codecs import BloscCodec

        monkeypatch.setattr(store, "_codecs", lambda: [BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")])
    root = tmp_path / "dmg.zarr"
    a = Archive.create(root)
    a.write(_case(BAD, 1))
    a.write(_case(GOOD, 2))
    monkeypatch.undo()
    return root


def _values_chunk(root: Path) -> Path:
    return root / "cases" / BAD / "values" / "c" / "0"


def _truncate(root: Path) -> None:
    with open(_values_chunk(root), "r+b") as f:  # as `truncate -s 1000` does
        os.ftruncate(f.fileno(), 1000)


def _cli(*args: str) -> Result:
    res = CliRunner().invoke(main, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert "Traceback" not in res.output
    return res


@pytest.mark.parametrize("legacy", [False, True], ids=["crc32c", "blosc-only"])
def test_a_truncated_chunk_is_refused_before_decompression(tmp_path: Path, legacy: bool,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    root = _archive(tmp_path, legacy, monkeypatch)
    _truncate(root)
    decoded: list[int] = []
    real = numcodecs.Blosc.decode
    monkeypatch.setattr(numcodecs.Blosc, "decode", lambda self, buf, out=None: decoded.append(len(buf)) or
                        real(self, buf, out))
    archive = Archive.open(root)
    with pytest.raises(ArchiveError, match=rf"^case {BAD}: field values: checksum error: .*refused before "
                                           "decompression"):
        archive.read(BAD)
    assert 1000 not in decoded and 996 not in decoded  # the cut chunk never reached Blosc
    assert archive.read(GOOD).rows == 64


def test_a_flipped_byte_fails_the_chunk_crc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _archive(tmp_path, False, monkeypatch)
    chunk = _values_chunk(root)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(ArchiveError, match=rf"case {BAD}: field values: checksum error: a chunk's CRC-32C "
                                           "does not match"):
        Archive.open(root).read(BAD)


@pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3")
def test_a_codec_no_archive_uses_is_refused_from_the_metadata(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    root = _archive(tmp_path, False, monkeypatch)
    meta = root / "cases" / BAD / "values" / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["codecs"][1] = {"name": "numcodecs.blosc", "configuration": {"cname": "lz4", "clevel": 5, "shuffle": 2}}
    meta.write_text(json.dumps(doc))
    with pytest.raises(ArchiveError, match=rf"case {BAD}: field values: codec numcodecs.blosc is not one"):
        Archive.open(root).read(BAD)


@pytest.mark.slow
@pytest.mark.parametrize("legacy", [False, True], ids=["crc32c", "blosc-only"])
def test_replay_inspect_and_export_name_the_truncated_case_and_go_on(tmp_path: Path, legacy: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    root = _archive(tmp_path, legacy, monkeypatch)
    _truncate(root)
    out = tmp_path / "r.json"
    res = _cli("replay", str(root), "--device", "cpu", "--selectors", "reference", "--rounds", "1",
               "--json", str(out), "--case", "*-c1024-*")
    assert res.exit_code == 0, res.output
    cases = {c["case_id"]: c for c in json.loads(out.read_text())["cases"]}
    assert set(cases) == {BAD, GOOD}
    assert "checksum error" in cases[BAD]["invalid"] and "worker died" not in cases[BAD]["invalid"]
    assert cases[GOOD]["results"][0]["status"] == "ok"
    assert "#0" not in res.output and "SIGSEGV" not in res.output

    res = _cli("inspect", str(root))
    assert res.exit_code == 1 and res.output.splitlines()[-1] == f"Error: 1 case invalid: {BAD} (listed above)"

    res = _cli("export", str(root), "--out", str(tmp_path / "st"))
    assert res.exit_code == 1, res.output
    assert res.output.splitlines()[-1].startswith(f"Error: 1 case not exported (damaged): {BAD}: field values: checksum error")
    assert [p.name for p in (tmp_path / "st").iterdir()] == [f"{GOOD}.safetensors"]


def test_a_case_no_worker_could_read_is_named_by_its_id() -> None:
    job = isolate.Job(("reference",), ("reference",), [], "seed-controls", "small", "cpu", {}, 1e30, None)
    headers: dict[int, CaseResult] = {}
    notes: list[str] = []
    end = isolate._End(1, False, None, "worker died: SIGSEGV")
    after = isolate._after(job, end, 3, headers, {}, {}, notes, ["a-c1", "b-c2", "c-c3"])
    assert after.start == 2
    assert headers[1].case_id == "b-c2" and "worker died: SIGSEGV" in str(headers[1].invalid)
    assert notes == ["case b-c2 could not be read: worker died: SIGSEGV"]
