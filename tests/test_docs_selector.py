"""The README's "Writing a selector" example is a working plugin: the very file it shows is saved as
`mytopk.py` and replayed with the README's command line, and it verifies on every case, declines with
its reasons where it says it will, and a plugin that returns True from `supports` is reported as the bug
it is. The README's "Python API" example runs as printed, as a script beside that plugin."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from logitreplay.archive import Archive, Case
from logitreplay.cli import main

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests import plugins  # noqa: E402


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def readme_example() -> tuple[str, list[str]]:
    """The python block and the `logitreplay ...` command line of the README's section."""
    section = _section((ROOT / "README.md").read_text(), "Writing a selector")
    (code,) = re.findall(r"```python\n(.*?)```", section, re.S)
    (shell,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return code, shlex.split(shell.strip())


@pytest.fixture
def mytopk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    code, command = readme_example()
    (tmp_path / "mytopk.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mytopk", raising=False)
    assert command[:2] == ["logitreplay", "replay"]
    return command[2:]


def _archive(tmp_path: Path) -> str:
    """The plugin suite's edge rows (short, offset, empty), a bf16 copy, a too-wide k and an -inf value."""
    path = tmp_path / "cases.zarr"
    archive = Archive.create(path)
    archive.write(plugins.plugin_case("edges"))
    case = plugins.plugin_case("edges-bf16")
    archive.write(Case.from_matrix("edges-bf16", case.padded(poison=0.0).bfloat16(), case.row_starts,
                                   case.row_ends, top_k=plugins.TOP_K, row_stride=case.cols))
    archive.write(Case.from_rows("k-wider", np.arange(4, dtype=np.float32), np.array([0], np.int32),
                                 np.array([4], np.int32), top_k=8, cols=4))
    archive.write(Case.from_rows("neg-inf", np.array([1.0, -np.inf, 2.0], np.float32), np.array([0], np.int32),
                                 np.array([3], np.int32), top_k=2, cols=3))
    return str(path)


def test_the_readme_plugin_verifies_with_the_readme_command(mytopk: list[str], tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", _archive(tmp_path), *mytopk, "--rounds", "1", "--json", str(out)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output  # the command carries --strict: nothing failed or raised
    cases = {c["case_id"]: {r["selector"]: r for r in c["results"]} for c in json.loads(out.read_text())["cases"]}
    for case_id in ("edges", "edges-bf16"):
        assert cases[case_id]["mytopk"]["status"] == "ok", cases[case_id]
    assert cases["k-wider"]["mytopk"]["status"] == "unsupported"
    assert "wider than the matrix" in cases["k-wider"]["mytopk"]["reason"]
    assert "-inf" in cases["neg-inf"]["mytopk"]["reason"]
    assert cases["neg-inf"]["reference"]["status"] == "ok"


def test_supports_returning_true_is_an_error_not_unsupported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "guess.py").write_text(
        "from tests.plugins import make_good\n"
        "def make():\n"
        "    sel = make_good()\n"
        "    sel.name = 'guess'\n"
        "    sel.supports = lambda case, device: True  # the natural guess\n"
        "    return sel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "one.zarr"
    Archive.create(path).write(plugins.plugin_case())
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["replay", str(path), "--selectors", "reference", "--selector", "guess:make",
                                    "--json", str(out), "--rounds", "1"], catch_exceptions=False)
    (guess,) = [r for r in json.loads(out.read_text())["cases"][0]["results"] if r["selector"] == "guess"]
    assert guess["status"] == "error" and "supports() returned True" in guess["reason"]
    assert "RESULTS FAILED" in res.output  # said loudly at the end, not an "unsupported: True" cell


def test_a_selector_without_a_string_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "noname.py").write_text(
        "from tests.plugins import make_good\n"
        "def make():\n"
        "    sel = make_good()\n"
        "    sel.name = None\n"
        "    return sel\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from logitreplay.errors import SelectorError
    from logitreplay.selectors import build

    with pytest.raises(SelectorError, match="name must be a non-empty string"):
        build("noname:make")


@pytest.mark.slow
def test_the_readme_python_api_example_runs_as_printed_beside_the_plugin(tmp_path: Path) -> None:
    code, _ = readme_example()
    (tmp_path / "mytopk.py").write_text(code)
    (api,) = re.findall(r"```python\n(.*?)```", _section((ROOT / "README.md").read_text(), "Python API"), re.S)
    (tmp_path / "api.py").write_text(api)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    ran = subprocess.run([sys.executable, "api.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
    printed = [line.split(" ", 1) for line in ran.stdout.splitlines()]
    assert [case_id for case_id, _ in printed] == ["a-normal-c1024-r512-k512", "a-normal-c6400-r512-k512",
                                                   "a-normal-c12800-r512-k512"]
    assert all("('mytopk', 'ok'," in results for _, results in printed), ran.stdout
    merged = json.loads((tmp_path / "seed-controls.json").read_text())
    assert [c["case_id"] for c in merged["cases"]] == [case_id for case_id, _ in printed]
