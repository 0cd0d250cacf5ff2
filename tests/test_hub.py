"""Publishing and fetching datasets: the card, the staged layout, and push / pull / hf:// streaming over real
HTTP through the real huggingface_hub client, against the loopback Hub in `hub_server.py`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from hub_server import LoopbackHub, point_client_at
from huggingface_hub import DatasetCard, constants

from logitreplay.archive import Archive, Case
from logitreplay.cli import main
from logitreplay.datasets import hub, synth
from logitreplay.datasets.card import build_card
from logitreplay.datasets.export import read_file

GOOD, BAD = "hf_loopback_good_token", "hf_loopback_bad_token_0123456789"
REPO = "org/stress"


@pytest.fixture(scope="module")
def suite_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "stress.zarr"
    archive = Archive.create(path, attrs={"title": "logitreplay stress (small)"})
    for recipe in synth.recipes("stress", "small"):
        if not isinstance(recipe, synth.FloodRecipe):  # the 12 cases the sizes below are counted on
            archive.write(synth.generate(recipe))
    return path


@pytest.fixture(scope="module")
def staged(suite_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> hub.Staged:
    return hub.stage(Archive.open(suite_archive), REPO, tmp_path_factory.mktemp("staged") / "s")


@pytest.fixture
def loopback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LoopbackHub]:
    """The client reads its endpoint and token file once at import; point them at this test's server."""
    with LoopbackHub(tokens={GOOD}) as h:
        point_client_at(h, monkeypatch, tmp_path)
        yield h


def _same(a: Case, b: Case) -> bool:
    return (a.values.tobytes(), a.offsets.tobytes(), a.row_starts.tobytes(), a.row_ends.tobytes(), a.attrs) == \
        (b.values.tobytes(), b.offsets.tobytes(), b.row_starts.tobytes(), b.row_ends.tobytes(), b.attrs)


def _one_line_error(output: str) -> bool:
    lines = output.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("Error: ")


# ------------------------------------------------------------------------------------------- card


def test_card_round_trips_through_datasetcard_load(suite_archive: Path, tmp_path: Path) -> None:
    archive = Archive.open(suite_archive)
    build_card(archive, REPO).save(tmp_path / "README.md")
    card = DatasetCard.load(tmp_path / "README.md")
    data = card.data.to_dict()
    assert data["license"] == "cc-by-4.0" and data["pretty_name"] == "logitreplay stress (small)"
    assert "sparse-attention" in data["tags"] and data["size_categories"] == ["n<1K"] and data["viewer"] is False
    fields = data["logitreplay"]
    assert fields["cases"] == len(archive) and fields["sources"] == ["synthetic"]
    assert "relative to row_starts[r]" in fields["selector_semantics"]
    rows = [line.split(" | ") for line in card.text.splitlines() if line.startswith("| `")]
    assert [(r[0].strip("| `"), r[-1].strip(" `|")) for r in rows] == \
        [(i.case_id, i.attrs["sha256"]) for i in archive.infos()]
    assert f"logitreplay replay hf://datasets/{REPO}" in card.text
    # Derived from the data alone: regenerating, here through the command, gives the same bytes.
    r = CliRunner().invoke(main, ["card", str(suite_archive), REPO, "--out", str(tmp_path / "again.md")])
    assert r.exit_code == 0 and (tmp_path / "again.md").read_text() == (tmp_path / "README.md").read_text()


def test_card_records_models_revisions_engines_and_policy(tmp_path: Path) -> None:
    base = next(synth.suite("stress", "small"))
    prov = {"source": "vllm", "model": "deepseek-ai/DeepSeek-V3.2", "revision": "f" * 40, "engine": "vllm",
            "engine_version": "0.11.0", "capture_policy": "first-per-layer-width",
            "layer_name": "model.layers.3.self_attn.indexer"}
    archive = Archive.create(tmp_path / "cap.zarr")
    archive.write(Case(base.case_id, base.values, base.offsets, base.row_starts, base.row_ends, base.top_k,
                       base.cols, base.row_stride, base.dtype, None, prov))
    card = build_card(archive, "org/captured")
    fields = card.data.to_dict()["logitreplay"]
    assert fields["models"] == [{"id": "deepseek-ai/DeepSeek-V3.2", "revision": "f" * 40}]
    assert fields["engines"] == [{"name": "vllm", "version": "0.11.0"}]
    assert fields["capture_policy"] == ["first-per-layer-width"]
    assert "| model.layers.3.self_attn.indexer |" in card.text and f"`{'f' * 40}`" in card.text


@pytest.mark.parametrize("suite", ["seed-controls", "stress", "decode", "decode-bf16",
                                   # the indexer suites' smallest cases are q.k over 163840 and 8192 x 2048 keys
                                   pytest.param("indexer-decode", marks=pytest.mark.slow),
                                   pytest.param("indexer", marks=pytest.mark.slow),
                                   pytest.param("long-decode", marks=pytest.mark.slow),
                                   pytest.param("long", marks=pytest.mark.slow)])
def test_published_control_suite_cards_match_their_recipes(suite: str) -> None:
    card = DatasetCard.load(Path(__file__).parents[1] / "datasets" / suite / "README.md")
    table = {r[0].strip("| `"): [c.strip(" `|") for c in r[1:]]
             for r in (line.split(" | ") for line in card.text.splitlines() if line.startswith("| `"))}
    recipes = synth.recipes(suite, "full")
    assert sorted(table) == sorted(r.case_id for r in recipes)
    for r in recipes:
        assert table[r.case_id][1:5] == [str(r.rows), str(r.cols), str(r.top_k), r.dtype]
    # Checksums: the smallest case regenerated here (the whole full-scale suite takes about a minute; the
    # long suites' indexer-made cases minutes each, so of equal sizes a normal control is the one).
    smallest = synth.generate(min(recipes, key=lambda r: (r.rows * r.cols, isinstance(r, synth.IndexerRecipe))))
    assert table[smallest.case_id][5:] == [str(smallest.nbytes), smallest.sha256()]
    assert card.data.to_dict()["logitreplay"]["cases"] == len(recipes)


# ---------------------------------------------------------------------------------------- staging


def test_push_dry_run_stages_a_valid_card_and_sharded_archive_within_limits(
        suite_archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # a dry run never talks to the Hub
    stage_dir = tmp_path / "stage"
    r = CliRunner().invoke(main, ["push", str(suite_archive), REPO, "--dry-run", "--stage", str(stage_dir), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output)
    files = [p for p in stage_dir.rglob("*") if p.is_file()]
    assert report["files"] == len(files) < hub.HUB_MAX_FILES
    assert report["largest_folder"]["entries"] < hub.HUB_MAX_FOLDER_ENTRIES
    assert DatasetCard.load(stage_dir / "README.md").data.to_dict()["logitreplay"]["cases"] == 12

    src, dst = Archive.open(suite_archive), Archive.open(stage_dir)
    assert dst.case_ids() == src.case_ids() and dst.attrs == src.attrs
    for cid in src.case_ids():
        assert _same(src.read(cid), dst.read(cid))
        case_files = [p for p in (stage_dir / "cases" / cid).rglob("*") if p.is_file()]
        assert len(case_files) <= 11  # group + (metadata + one shard) per array, whatever the chunk count


def test_dry_run_without_stage_leaves_no_folder_and_stages_deterministically(
        suite_archive: Path, staged: hub.Staged, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the temporary staging folder goes
    r = CliRunner().invoke(main, ["push", str(suite_archive), REPO, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "staged 12 cases" in r.output and "now removed" in r.output
    assert list(temp.iterdir()) == []  # a dry run used to leave a copy of the archive on every call
    # Same archive, same bytes: a rerun of an interrupted push uploads nothing the Hub already holds.
    path = tmp_path / "again"
    assert CliRunner().invoke(main, ["push", str(suite_archive), REPO, "--dry-run", "--stage", str(path)]).exit_code == 0
    files = sorted(p.relative_to(path) for p in path.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(staged.path) for p in staged.path.rglob("*") if p.is_file())
    assert all((path / f).read_bytes() == (staged.path / f).read_bytes() for f in files)


def test_staging_refuses_a_used_folder_and_archives_beyond_the_limits(
        suite_archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    runner = CliRunner()
    r = runner.invoke(main, ["push", str(suite_archive), REPO, "--dry-run", "--stage", str(used)])
    assert r.exit_code == 1 and _one_line_error(r.output) and (used / "keep.txt").read_text() == "mine"
    damaged = tmp_path / "damaged.zarr"
    shutil.copytree(suite_archive, damaged)
    chunk = damaged / "cases" / "dist-relu-c2048-r128-k512" / "values" / "c" / "0"
    chunk.write_bytes(chunk.read_bytes()[:-8] + b"\0" * 8)
    r = runner.invoke(main, ["push", str(damaged), REPO, "--dry-run", "--stage", str(tmp_path / "d")])
    assert r.exit_code == 1 and _one_line_error(r.output) and "dist-relu" in r.output
    assert not (tmp_path / "d").exists()  # a failed staging leaves nothing behind
    monkeypatch.setattr(hub, "HUB_MAX_FILES", 50)
    r = runner.invoke(main, ["push", str(suite_archive), REPO, "--dry-run", "--stage", str(tmp_path / "big")])
    assert r.exit_code == 1 and _one_line_error(r.output) and "beyond the Hub's limits" in r.output
    assert not (tmp_path / "big").exists()
    monkeypatch.setattr(hub, "HUB_MAX_FOLDER_ENTRIES", 5)  # refused before anything is written
    r = runner.invoke(main, ["push", str(suite_archive), REPO, "--dry-run", "--stage", str(tmp_path / "wide")])
    assert r.exit_code == 1 and "13 entries in cases" in r.output and not (tmp_path / "wide").exists()


@pytest.mark.parametrize("args", [["push", "ARCHIVE", "org/name@v1", "--dry-run"],
                                  ["push", "ARCHIVE", "org/na me", "--dry-run"],
                                  ["pull", "justaname"], ["pull", "a/b/c"], ["card", "ARCHIVE", "org", "--out", "x.md"]])
def test_bad_repo_ids_are_one_line_errors(suite_archive: Path, tmp_path: Path, args: list[str]) -> None:
    r = CliRunner().invoke(main, [str(suite_archive) if a == "ARCHIVE" else a for a in args])
    assert r.exit_code == 1 and _one_line_error(r.output) and "ORG/NAME" in r.output, r.output


# ---------------------------------------------------------------------------- over HTTP (loopback)


@pytest.mark.slow
def test_push_then_stream_and_pull_pinned_revisions(loopback: LoopbackHub, suite_archive: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", GOOD)
    runner = CliRunner()
    r = runner.invoke(main, ["push", str(suite_archive), REPO, "--json"])
    assert r.exit_code == 0, r.output
    first = json.loads(r.output)
    assert first["url"] == f"hf://datasets/{REPO}@{first['commit']}"
    assert loopback.repos[REPO].refs["main"] == first["commit"]

    # Streaming: opening pins main to its commit; reading one case fetches that case's bytes, not the rest.
    src = Archive.open(suite_archive)
    target = "bigk-normal-c8192-r64-k4096"
    before = loopback.bytes_served
    remote = Archive.open(f"hf://datasets/{REPO}")
    assert remote.location == first["url"]
    listed = len(loopback.requests)
    assert len(remote.infos()) == 12 and len(loopback.requests) - listed < 12  # consolidated: not one per case
    assert _same(remote.read(target), src.read(target))
    total = sum(len(b) for b in loopback.repos[REPO].commits[first["commit"]].values())
    streamed = loopback.bytes_served - before
    assert streamed < total - 2_000_000  # the other cases' shards (about 4 MB) were never downloaded
    r = runner.invoke(main, ["inspect", f"hf://datasets/{REPO}", "--case", target, "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["cases"][0]["rows"] == 64
    assert json.loads(r.output)["archive"] == first["url"]  # the record names the commit, not the branch
    r = runner.invoke(main, ["export", f"hf://datasets/{REPO}", "--case", target, "--out", str(tmp_path / "st")])
    assert r.exit_code == 0 and _same(read_file(tmp_path / "st" / f"{target}.safetensors"), src.read(target))

    # A second push mirrors the new archive (a deleted case disappears from main), old commits stay readable.
    smaller = tmp_path / "smaller.zarr"
    shutil.copytree(suite_archive, smaller)
    shutil.rmtree(smaller / "cases" / target)
    r = runner.invoke(main, ["push", str(smaller), REPO, "--json"])
    assert r.exit_code == 0, r.output
    assert target not in Archive.open(f"hf://datasets/{REPO}").case_ids()
    assert target in Archive.open(first["url"]).case_ids()

    out = tmp_path / "pulled"
    r = runner.invoke(main, ["pull", f"{REPO}@{first['commit']}", "--out", str(out),
                             "--include", f"cases/{target}/**", "--json"])
    assert r.exit_code == 0, r.output
    pulled = Archive.open(out)
    assert pulled.case_ids() == [target] and _same(pulled.read(target), src.read(target))
    assert json.loads((out / hub.SOURCE_FILE).read_text())["commit"] == first["commit"]
    assert Path(os.environ["HF_XET_CACHE"]).is_relative_to(out)  # xet's chunk cache stays inside the target
    # A pulled copy is an ordinary archive: a case appended to it is listed and read back.
    Archive.create(out).write(src.read("dist-ties-c2048-r128-k512"))
    assert Archive.open(out).case_ids() == ["bigk-normal-c8192-r64-k4096", "dist-ties-c2048-r128-k512"]


def test_private_push_is_visible_only_with_a_token(loopback: LoopbackHub, suite_archive: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    one = Archive.create(tmp_path / "one.zarr")
    one.write(Archive.open(suite_archive).read("edges-normal-c2048-r128-k512-edges"))
    monkeypatch.setenv("HF_TOKEN", GOOD)
    r = CliRunner().invoke(main, ["push", str(tmp_path / "one.zarr"), "org/secret", "--private"])
    assert r.exit_code == 0, r.output
    assert loopback.repos["org/secret"].private and Archive.open("hf://datasets/org/secret").case_ids()
    monkeypatch.delenv("HF_TOKEN")
    r = CliRunner().invoke(main, ["inspect", "hf://datasets/org/secret"])
    assert r.exit_code == 1 and "repository not found" in r.output


def test_replay_reads_a_dataset_straight_from_the_hub(loopback: LoopbackHub, suite_archive: Path,
                                                      tmp_path: Path) -> None:
    one = Archive.create(tmp_path / "one.zarr")
    one.write(Archive.open(suite_archive).read("edges-normal-c2048-r128-k512-edges"))
    loopback.publish_folder("org/one", hub.stage(one, "org/one", tmp_path / "stage").path)
    r = CliRunner().invoke(main, ["replay", "hf://datasets/org/one", "--selectors", "reference",
                                  "--rounds", "1", "--strict"])
    assert r.exit_code == 0, r.output
    assert "2048" in r.output and "128" in r.output


_FAILURES = [(cmd, sc) for cmd in ("pull", "inspect") for sc in ("missing-repo", "missing-revision", "bad-token",
                                                                    "offline", "unreachable")]
_FAILURES += [("push", "bad-token"), ("push", "offline"), ("push", "no-token")]


@pytest.mark.parametrize("command,scenario", _FAILURES, ids=[f"{c}-{s}" for c, s in _FAILURES])
def test_hub_failures_are_one_line_errors_without_the_token(
        loopback: LoopbackHub, staged: hub.Staged, suite_archive: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, command: str, scenario: str) -> None:
    loopback.publish_folder(REPO, staged.path)
    ref = {"missing-repo": "org/absent", "missing-revision": f"{REPO}@v9"}.get(scenario, REPO)
    if scenario != "no-token":
        monkeypatch.setenv("HF_TOKEN", BAD if scenario == "bad-token" else GOOD)
    if scenario == "offline":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    if scenario == "unreachable":
        with LoopbackHub() as gone:
            closed = gone.endpoint  # a loopback port nothing listens on once the server has stopped
        monkeypatch.setattr(constants, "ENDPOINT", closed)
    args = {"pull": ["pull", ref, "--out", str(tmp_path / "out")],
            "inspect": ["inspect", f"hf://datasets/{ref}"],
            "push": ["push", str(suite_archive), "org/new"]}[command]
    commits = {k: dict(v.commits) for k, v in loopback.repos.items()}
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1 and _one_line_error(r.output), r.output
    assert GOOD not in r.output and BAD not in r.output
    assert not (tmp_path / "out").exists()
    assert {k: dict(v.commits) for k, v in loopback.repos.items()} == commits  # nothing was written remotely


def test_pull_never_overwrites_unrelated_files_and_reruns_into_its_own_folder(
        loopback: LoopbackHub, staged: hub.Staged, tmp_path: Path) -> None:
    loopback.publish_folder(REPO, staged.path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my notes")
    runner = CliRunner()
    r = runner.invoke(main, ["pull", REPO, "--out", str(mine)])
    assert r.exit_code == 1 and _one_line_error(r.output) and (mine / "README.md").read_text() == "my notes"
    out = tmp_path / "out"
    for _ in range(2):  # a second pull (an update, or the rerun of an interrupted one) uses the same folder
        r = runner.invoke(main, ["pull", REPO, "--out", str(out), "--json"])
        assert r.exit_code == 0, r.output
    assert json.loads((out / hub.SOURCE_FILE).read_text())["complete"] is True
    assert Archive.open(out).case_ids() == Archive.open(staged.path).case_ids()


def test_pull_refuses_names_that_escape_the_target(loopback: LoopbackHub, tmp_path: Path) -> None:
    loopback.commit("org/evil", {"README.md": b"---\n{}\n---\n", "../escape.txt": b"x"})
    r = CliRunner().invoke(main, ["pull", "org/evil", "--out", str(tmp_path / "t" / "out")])
    assert r.exit_code == 1 and _one_line_error(r.output), r.output
    assert not (tmp_path / "t" / "escape.txt").exists()


@pytest.mark.slow
def test_pull_through_hf_endpoint_writes_only_inside_the_target(staged: hub.Staged, tmp_path: Path) -> None:
    """As a user runs it: a fresh process, HF_ENDPOINT set, default --out under datasets/downloads/."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    with LoopbackHub() as h:
        sha = h.publish_folder(REPO, staged.path)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env.update(HF_ENDPOINT=h.endpoint, HF_HOME=str(home), HF_HUB_DISABLE_PROGRESS_BARS="1")
        cli = [sys.executable, "-c", "from logitreplay.cli import main; main()"]
        r = subprocess.run([*cli, "pull", REPO, "--json"], cwd=work, env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        offline = subprocess.run([*cli, "inspect", f"hf://datasets/{REPO}"], cwd=work,
                                 env={**env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=120)
    target = work / "datasets" / "downloads" / "org" / "stress"
    assert json.loads(r.stdout)["commit"] == sha and Archive.open(target).case_ids()
    assert [p.name for p in work.iterdir()] == ["datasets"] and not home.exists()
    assert offline.returncode == 1 and _one_line_error(offline.stderr) and "offline" in offline.stderr
