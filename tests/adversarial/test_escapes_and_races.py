"""Writers that could be led outside the archive, and writers that race (issue 17, items 5 and 8): a
symbolic link inside an archive is never written through, a Hub answer is validated before any path is
made from it, and two writers of one archive either both succeed or the second gets one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from logitreplay.archive import Archive
from logitreplay.cli import main
from logitreplay.datasets import synth
from logitreplay.datasets.hub import SOURCE_FILE
from tests.hub_server import LoopbackHub, point_client_at
from tests.plugins import plugin_case

ROOT = Path(__file__).resolve().parents[2]


def test_synth_never_writes_through_a_symlinked_case_folder(tmp_path: Path) -> None:
    out = tmp_path / "A"
    first = synth.recipes("seed-controls", "small")[0].case_id
    Archive.create(out)
    outside = tmp_path / "outside"
    outside.mkdir()
    (out / "cases" / first).symlink_to(outside, target_is_directory=True)
    res = CliRunner().invoke(main, ["synth", "--suite", "seed-controls", "--out", str(out)])
    assert res.exit_code == 1 and "symbolic link" in res.output and len(res.output.strip().splitlines()) == 1
    assert list(outside.iterdir()) == []
    # repair removes the link itself, never what it points to
    assert CliRunner().invoke(main, ["repair", str(out)]).exit_code == 0
    assert outside.is_dir() and not (out / "cases" / first).exists()


def test_overwrite_and_remove_never_follow_a_symlink(tmp_path: Path) -> None:
    a = Archive.create(tmp_path / "A")
    outside = tmp_path / "outside"
    Archive.create(outside).write(plugin_case("victim"))
    (tmp_path / "A" / "cases" / "victim").symlink_to(outside / "cases" / "victim", target_is_directory=True)
    with pytest.raises(Exception, match="symbolic link"):
        a.write(plugin_case("victim"), overwrite=True)
    assert Archive.open(outside).read("victim").rows == 6


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LoopbackHub]:
    with LoopbackHub() as h:
        point_client_at(h, monkeypatch, tmp_path)
        yield h


def test_pull_refuses_a_sha_that_is_a_path(loopback: LoopbackHub, tmp_path: Path) -> None:
    sha = loopback.commit("org/evil", {"README.md": b"---\n{}\n---\n"})
    hostile = str(tmp_path / "planted")
    repo = loopback.repos["org/evil"]
    repo.commits[hostile], repo.refs["main"] = repo.commits[sha], hostile
    res = CliRunner().invoke(main, ["pull", "org/evil", "--out", str(tmp_path / "out")])
    assert res.exit_code == 1 and "did not report a commit sha" in res.output, res.output
    assert not Path(hostile).exists() and not list(tmp_path.rglob("planted*"))


@pytest.mark.parametrize("name", [".cache/huggingface/download/x", SOURCE_FILE, "a\\..\\..\\x", "cases/./x",
                                  "cases//x", "cases/\x01x"])
def test_pull_refuses_names_over_its_bookkeeping_or_oddly_formed(loopback: LoopbackHub, tmp_path: Path,
                                                                 name: str) -> None:
    loopback.commit("org/evil", {"README.md": b"---\n{}\n---\n", name: b"x"})
    res = CliRunner().invoke(main, ["pull", "org/evil", "--out", str(tmp_path / "out")])
    assert res.exit_code == 1 and "refused" in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "out" / "README.md").exists()  # refused before any file was downloaded


@pytest.mark.slow
def test_two_synths_into_one_archive_at_once(tmp_path: Path) -> None:
    out = tmp_path / "A"
    cmd = [sys.executable, "-m", "logitreplay.cli", "synth", "--suite", "stress", "--out", str(out)]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
             for _ in range(2)]
    runs = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for code, _, err in runs:
        assert "Traceback" not in err, err
        assert code == 0 or err.strip() == f"Error: {out}: archive is being written by another process; try " \
                                           "again when it has finished", err
    archive = Archive.open(out)
    assert archive.incomplete() == [] and len(archive.case_ids()) == len(synth.recipes("stress", "small"))
    for cid in archive.case_ids():
        archive.read(cid)
