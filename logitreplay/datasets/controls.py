"""Controls of real cases: derived cases that keep a case's shape and change only its values.

A synthetic suite says how selectors behave on random data of chosen shapes; it cannot say whether
random data stands in for *these* logits. The controls answer that per captured case, with everything
but the values held fixed (rows, bounds, cols, row stride, dtype, top_k):

- `matched`: standard normal values (what "random test data" usually means);
- `ablate`: the case's own values + 100 and * 1e-8, rounded to the case's dtype (the distribution
  ablation that collapses fp16 histogram bins, applied to real scores), two derived cases;
- `shuffle`: the case's values permuted within each row (the same multiset per row, so the same top-k
  values and ties, with no positional structure left);
- `indexer`: scores made as DeepSeek V3.2's indexer makes them (`datasets/indexer.py`: FP8 per-head q.k,
  ReLU, weighted sum, sinks, recency, repeated text) for the case's rows, each row's keys its own column
  range of one text as wide as the case, its query the row's last key (what synthetic indexer logits in
  this shape would look like, beside what the captured ones are).

Random draws are seeded from the real case's id and the control's name, so a control is the same on
every machine and run; the seed is recorded in its attributes. The replay source (`replay/sources.py`)
and `synth --like` both derive through `with_controls`, so a replayed control and a shared one are the
same bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np
import torch

from logitreplay.archive import Case, ids
from logitreplay.datasets.indexer import Indexer, IndexerModel

# Control kind (what users name) -> the derived cases it adds (their names).
KINDS: dict[str, tuple[str, ...]] = {
    "matched": ("matched",),
    "ablate": ("ablate+100", "ablate*1e-8"),
    "shuffle": ("shuffle",),
    "indexer": ("indexer",),
}
# What `synth --like` writes unless told: the indexer control computes q.k over the whole shape, so it is
# asked for by name.
DEFAULT_KINDS = ("matched", "ablate", "shuffle")
SEPARATOR = ids.SEPARATOR  # a derived case is named <real case id>~<suffix>
_SUFFIX = {"matched": "matched", "ablate+100": "plus100", "ablate*1e-8": "times1e-8", "shuffle": "shuffle",
           "indexer": "indexer"}
INDEXER = IndexerModel.of("deepseek-v3.2")  # the indexer control's model and structure (recorded on it)
_NAME = {suffix: name for name, suffix in _SUFFIX.items()}


def parse(text: str) -> tuple[str, ...]:
    """`matched,ablate,shuffle` -> the control kinds, in the order given; raises ValueError naming an
    unknown kind."""
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown control {unknown[0]!r}; known: {', '.join(KINDS)}")
    return kinds


def derived_names(kinds: Sequence[str]) -> list[str]:
    """The derived cases the kinds add to each case (e.g. `ablate` adds two)."""
    return [name for kind in kinds for name in KINDS[kind]]


def control_id(case_id: str, name: str) -> str:
    return f"{case_id}{SEPARATOR}{_SUFFIX[name]}"


def split_id(case_id: str) -> tuple[str, str | None]:
    """(real case id, control name) of a derived case's id; (case_id, None) for any other case."""
    base, sep, suffix = case_id.rpartition(SEPARATOR)
    if sep and suffix in _NAME:
        return base, _NAME[suffix]
    return case_id, None


def seed(case_id: str, name: str) -> int:
    """The seed of a control's random draws: a hash of the real case's id and the control's name."""
    return int.from_bytes(hashlib.sha256(f"{case_id}/{name}".encode()).digest()[:8], "little")


def derive(case: Case, name: str) -> Case:
    """One derived case (see the module docstring); the real case is not modified."""
    values = case.torch_values()
    s: int | None = None
    if name == "matched":
        s = seed(case.case_id, name)
        new = torch.from_numpy(np.random.default_rng(s).standard_normal(values.numel(), dtype=np.float32))
    elif name == "ablate+100":
        new = values.float() + 100.0
    elif name == "ablate*1e-8":
        new = values.float() * 1e-8
    elif name == "shuffle":
        s = seed(case.case_id, name)
        new = values[torch.from_numpy(_row_permutation(case.lengths, np.random.default_rng(s)))]
    elif name == "indexer":
        s = seed(case.case_id, name)
        new = torch.from_numpy(Indexer(INDEXER, s).ragged(case.cols, case.row_starts, case.row_ends,
                                                           np.random.default_rng([s, 5])))
    else:
        raise ValueError(f"unknown control {name!r}; known: {', '.join(_SUFFIX)}")
    new = new.to(values.dtype)  # ablations are rounded once, to the case's own dtype
    attrs: dict[str, Any] = {"source": "control", "control": name, "control_of": case.case_id, "control_seed": s,
             "distribution": f"{name} control",
             **({"indexer": asdict(INDEXER)} if name == "indexer" else {}),
             **{k: case.attrs[k] for k in ("kind", "decode") if k in case.attrs}}  # a decode call stays one
    return Case.from_rows(control_id(case.case_id, name), new, case.row_starts, case.row_ends, top_k=case.top_k,
                          cols=case.cols, row_stride=case.row_stride, attrs=attrs)


def with_controls(case: Case, kinds: Sequence[str]) -> Iterator[Case]:
    """The case, then each of its derived cases, made one at a time (a full-scale case is large)."""
    yield case
    for name in derived_names(kinds):
        yield derive(case, name)


def _row_permutation(lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices into the ragged values that permute each row within itself (uniformly at random)."""
    rows = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), lengths)
    return np.lexsort((rng.random(rows.shape[0]), rows))


__all__ = ["DEFAULT_KINDS", "KINDS", "SEPARATOR", "control_id", "derive", "derived_names", "parse", "seed", "split_id",
           "with_controls"]
