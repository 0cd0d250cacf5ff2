"""Hostile `.safetensors` files (issue 17, item 6): every metadata field and tensor is checked for its
type and range; a bad file is a one-line error and leaves no output behind, and nothing is silently
coerced (7.9 is not 7, a NaN index is not -2147483648)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file

from logitreplay.cli import main
from logitreplay.datasets.export import METADATA_KEY, case_metadata, case_to_tensors
from tests.plugins import plugin_case

Edit = Callable[[dict[str, torch.Tensor], dict[str, Any]], Any]


def _meta(**kv: Any) -> Edit:
    return lambda t, m: m.update(kv)


def _tensor(name: str, value: torch.Tensor) -> Edit:
    return lambda t, m: (t.update({name: value}), m.pop(name, None))


HOSTILE: dict[str, tuple[Edit, str]] = {
    "metadata not an object": (lambda t, m: (m.clear(), m.update(_raw="[1, 2]")), "not a JSON object"),
    "top_k a string": (_meta(top_k="x"), "field top_k: expected an integer"),
    "top_k 7.9": (_meta(top_k=7.9), "field top_k: expected an integer"),
    "cols null": (_meta(cols=None), "field cols: expected an integer"),
    "provenance a string": (_meta(provenance="x"), "field provenance: not a JSON object"),
    "case_id escaping": (_meta(case_id="../../evil"), "field case_id"),
    "case_id hidden": (_meta(case_id=".hidden"), "field case_id"),
    "rows that lie": (_meta(rows=10**12), "field rows"),
    "top_k tensor of 2 elements": (_tensor("top_k", torch.tensor([8, 9])), "field top_k: expected an integer scalar"),
    "top_k tensor 7.9": (_tensor("top_k", torch.tensor(7.9)), "field top_k: expected an integer scalar"),
    "cols tensor NaN": (_tensor("cols", torch.tensor(float("nan"))), "field cols: expected an integer scalar"),
    "NaN reference indices": (_tensor("reference_indices", torch.full((6, 8), float("nan"))),
                              "field reference_indices: expected integers"),
    "reference indices below -1": (_tensor("reference_indices", torch.full((6, 8), -5, dtype=torch.int32)),
                                   "field reference_indices"),
}


def _write(path: Path, edit: Edit) -> Path:
    case = plugin_case("h")
    case.reference_indices = torch.zeros(6, 8, dtype=torch.int32).numpy()
    tensors = {k: v.contiguous() for k, v in case_to_tensors(case).items()}
    meta = json.loads(case_metadata(case, float("-inf"))[METADATA_KEY])
    edit(tensors, meta)
    raw = meta.pop("_raw", None)
    save_file(tensors, str(path), metadata={METADATA_KEY: raw if raw is not None else json.dumps(meta)})
    return path


@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_hostile_file_is_one_line_error_and_leaves_nothing(tmp_path: Path, hostile: str) -> None:
    edit, message = HOSTILE[hostile]
    f = _write(tmp_path / "h.safetensors", edit)
    out = tmp_path / "out.zarr"
    res = CliRunner().invoke(main, ["import", str(f), "--out", str(out)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.exit_code == 1 and len(res.output.strip().splitlines()) == 1 and message in res.output, res.output
    assert not out.exists() and not (tmp_path / "evil").exists()


def test_the_untouched_file_imports(tmp_path: Path) -> None:
    f = _write(tmp_path / "h.safetensors", lambda t, m: None)
    res = CliRunner().invoke(main, ["import", str(f), "--out", str(tmp_path / "out.zarr")])
    assert res.exit_code == 0, res.output
