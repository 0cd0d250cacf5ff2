"""On a GPU, a selector that triggers an illegal memory access kills its process's CUDA context; with
`replay --isolate` that costs only its own results, and every other selector still verifies and times."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from logitreplay.archive import Archive
from logitreplay.cli import main
from tests.plugins import plugin_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")]


def test_illegal_memory_access_is_confined_to_its_selector(tmp_path: Path) -> None:
    a = Archive.create(tmp_path / "p.zarr")
    for i in range(2):
        a.write(plugin_case(f"p{i}"))
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, [
        "replay", str(tmp_path / "p.zarr"), "--device", "cuda", "--selectors", "reference,native,deepselect",
        "--selector", "tests.adversarial.faulty_plugins:make_illegal_access", "--isolate", "--timeout", "120",
        "--warmup", "2", "--rounds", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    for case in json.loads(out.read_text())["cases"]:
        by = {r["selector"]: r for r in case["results"]}
        assert all(by[s]["status"] == "ok" for s in ("reference", "native", "deepselect")), by
        assert by["illegal-access"]["status"] == "error"
