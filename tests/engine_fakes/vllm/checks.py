"""What the capture tests in the released vLLM share: the plugin installed in a loaded release, the
cases and summary it wrote, and the check of a case against the logits recomputed from its step."""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from logitreplay.archive.case import Case
from logitreplay.archive.store import Archive
from logitreplay.capture import serving
from logitreplay.capture.policy import Policy
from logitreplay.capture.vllm_plugin import VllmCapture
from logitreplay.capture.vllm_versions import release
from tests.engine_fakes.vllm import loader, prefill
from tests.engine_fakes.vllm.edges import Edges, fakes
from tests.engine_fakes.vllm.runner import RUNNERS


@pytest.fixture(params=["vllm_0330_tree", "vllm_0340_tree"], ids=["0.33.0", "0.34.0"])
def tree(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(request.param)


@contextmanager
def plugin(tree: Path, tmp_path: Path, edges: Edges, policy: str = "every", *,
           modules: dict[str, Callable[[str], types.ModuleType]] | None = None,
           **options: Any) -> Iterator[VllmCapture]:
    """The released vLLM of `tree` loaded with `edges` (`modules`: the fakes, default `fakes(edges)`), and
    the plugin installed as `register` does."""
    with loader.load(tree, {**(fakes(edges) if modules is None else modules), **RUNNERS}) as vllm:
        capture = VllmCapture(tmp_path / "cap.zarr", Policy.parse(policy), **options)
        capture.release = release(vllm.__version__)
        assert capture.release is not None
        capture.install()
        try:
            yield capture
        finally:
            capture.uninstall()
            serving._active = None


def cases(path: Path) -> list[Case]:
    archive = Archive.open(path)
    return sorted((archive.read(c) for c in archive.case_ids()), key=lambda c: c.attrs["chunk"].get("token_start", 0)
                  * 10**6 + c.attrs["chunk"].get("row_start", 0))


def summary(path: Path) -> dict[str, Any]:
    (found,) = path.glob("capture-summary-*.json")
    return dict(json.loads(found.read_text()))


def check(case: Case, step: prefill.Step, tokens: list[int]) -> None:
    """The case's rows are the recomputed logits of `tokens` (step tokens), within their bounds; its
    reference indices are the top-k of those logits."""
    assert case.rows == len(tokens)
    assert case.row_starts.tolist() == [0] * case.rows
    assert case.row_ends.tolist() == [step.owner[t][1] + 1 for t in tokens]
    for r, t in enumerate(tokens):
        want = prefill.expected(step, t)
        got = case.row(r).float()
        torch.testing.assert_close(got, want.to(case.row(r).dtype).float(), rtol=1e-2 if case.dtype == "bfloat16" else 1e-5,
                                   atol=1e-2 if case.dtype == "bfloat16" else 1e-5)
        picked = {int(i) for i in case.reference_indices[r] if i >= 0}
        assert len(picked) == min(prefill.TOP_K, len(want))
