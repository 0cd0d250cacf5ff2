"""bench/claims.py, which renders every figure table of the documents from the committed results: the
committed documents are what their data renders, rendering is deterministic, `--check` fails on a
hand-edited figure (and `make claims` puts it back), and every marked block has a renderer."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def claims() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))  # as `python bench/claims.py` sees its sibling scripts
    import claims

    return claims


@pytest.fixture
def tree(claims: ModuleType, tmp_path: Path) -> Path:
    """A copy of the documents and the committed results, to edit."""
    for rel in claims.DOCUMENTS:
        if (ROOT / rel).is_file():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / rel, tmp_path / rel)
    shutil.copytree(ROOT / claims.RESULTS, tmp_path / claims.RESULTS)
    return tmp_path


def test_the_committed_documents_are_what_their_data_renders(claims: ModuleType) -> None:
    assert claims.run(ROOT, check=True) == []


def test_rendering_is_deterministic(claims: ModuleType, tree: Path) -> None:
    for rel in claims.DOCUMENTS:
        if (tree / rel).is_file():
            text = (tree / rel).read_text()
            assert claims.render_text(text, tree, rel) == claims.render_text(text, tree, rel)


def test_check_fails_on_a_hand_edited_figure_and_claims_puts_it_back(claims: ModuleType, tree: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    readme = tree / "README.md"
    committed = readme.read_text()
    start = committed.index("<!-- claims: readme-h200 -->")
    figure = "| 146.1 |"
    at = committed.index(figure, start)
    readme.write_text(committed[:at] + "| 126.1 |" + committed[at + len(figure):])
    assert claims.main(["--check", "--root", str(tree)]) == 1
    err = capsys.readouterr().err
    assert "README.md" in err and "126.1" in err and "146.1" in err
    assert claims.main(["--root", str(tree)]) == 0
    assert readme.read_text() == committed
    assert claims.main(["--check", "--root", str(tree)]) == 0


def test_check_fails_when_the_data_changes(claims: ModuleType, tree: Path) -> None:
    path = tree / claims.RESULTS / claims.H200_FP32
    path.write_text(path.read_text().replace('"median_us": 146.', '"median_us": 136.', 1))
    assert claims.run(tree, check=True)


def test_prose_outside_the_blocks_is_left_as_written(claims: ModuleType, tree: Path) -> None:
    readme = tree / "README.md"
    text = readme.read_text().replace("## Commands", "## Commands (hand-edited heading)")
    readme.write_text(text)
    assert claims.main(["--root", str(tree)]) == 0
    assert readme.read_text() == text


def test_every_marked_block_has_a_renderer_and_every_renderer_a_block(claims: ModuleType) -> None:
    used = set()
    for rel in claims.DOCUMENTS:
        if (ROOT / rel).is_file():
            names = claims.blocks((ROOT / rel).read_text())
            assert set(names) <= set(claims.RENDERERS), rel
            used.update(names)
    assert used == set(claims.RENDERERS)


def test_an_unknown_or_unpaired_block_is_refused(claims: ModuleType, tree: Path) -> None:
    with pytest.raises(claims.ClaimsError, match="no renderer"):
        claims.render_text("x\n<!-- claims: no-such-table -->\n<!-- /claims -->\n", tree)
    with pytest.raises(claims.ClaimsError, match="without its pair"):
        claims.render_text("x\n<!-- claims: readme-h200 -->\nno end marker\n", tree)


def test_a_renderer_no_document_uses_fails_the_check(claims: ModuleType, tree: Path) -> None:
    readme = tree / "README.md"
    text = readme.read_text()
    start = text.index("<!-- claims: readme-rule -->")
    end = text.index("<!-- /claims -->", start) + len("<!-- /claims -->")
    readme.write_text(text[:start] + text[end:])
    assert any("readme-rule" in p and "no document" in p for p in claims.run(tree, check=True))


def test_a_table_states_its_command_hardware_and_date(claims: ModuleType) -> None:
    out = claims.RENDERERS["readme-h200"](ROOT)
    assert "2026-12-02" in out and "NVIDIA H200" in out and "logitreplay replay --device cuda" in out
    with pytest.raises(claims.ClaimsError, match="no command recorded"):
        claims.source(ROOT, "h200-2026-12-02/not-a-run.json")
