"""How wrong a wrong selection is: recall against the exact top-k, the rows affected, the largest score deficit.

Check 3 says only that a row's selected values are not the reference's, and names the first such row. A
kernel that misses one tied value in one row and one that loses most of a row's top-k both fail it; the
people who choose kernels (and approximate, low-precision selectors, which are judged by recall and not
by pass/fail) need the size of the damage:

- recall of a row: the fraction of the reference's values (as a multiset) that the selection holds. The
  multisets are compared on the values, as check 3 does, so the choice among tied candidates never
  lowers it; a row with nothing to select has recall 1.
- rows affected: the rows whose selected values differ from the reference's at all.
- the largest score deficit: over every row and rank, the reference's value at that rank minus the
  selection's value at the same rank (both sorted). Never negative for a selection of distinct in-bounds
  indices: the j-th largest of any k of a row's values is at most the row's j-th largest. Slots the
  selection left empty (-1, or an index out of bounds) count in the recall, not here.

Whole-tensor, like verify.py: one batched search per row of sorted values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Damage:
    """The damage of one selection on one case (module docstring): `recall_min` and `recall_mean` over the
    rows with at least one value to select, `rows` of `of_rows` rows affected, `max_deficit` the largest
    score deficit (0.0 where no pair of ranks holds two finite values)."""

    recall_min: float
    recall_mean: float
    rows: int
    of_rows: int
    max_deficit: float

    def short(self) -> str:
        """The narrow table's cell: the minimum recall, e.g. `r.53` (`r1` only if rounding hides a loss)."""
        text = f"{self.recall_min:.2f}"
        return "r" + (text.lstrip("0") if self.recall_min < 1 else "1")

    def __str__(self) -> str:
        return (f"recall min {self.recall_min:.4f}, mean {self.recall_mean:.4f} over rows; {self.rows} of "
                f"{self.of_rows} rows affected; largest score deficit {self.max_deficit:.6g}")


def row_recall(got: torch.Tensor, expected: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """Per row, the fraction of the last `need` values of `expected` (each row sorted ascending) that the
    multiset `got` (sorted ascending, -inf for empty slots) holds; 1 where `need` is 0.

    Each expected value is paired with its occurrence among equal values (its position minus the first
    position of that value), and is found when `got` holds more copies of it than that occurrence."""
    k = expected.shape[1]
    if k == 0:
        return torch.ones(expected.shape[0], dtype=torch.float64, device=expected.device)
    first = torch.searchsorted(expected, expected, side="left")
    occurrence = torch.arange(k, device=expected.device).unsqueeze(0) - first
    held = torch.searchsorted(got, expected, side="right") - torch.searchsorted(got, expected, side="left")
    wanted = torch.arange(k, device=expected.device).unsqueeze(0) >= (k - need).unsqueeze(1)
    found = ((occurrence < held) & wanted).sum(1)
    return torch.where(need > 0, found.double() / need.clamp(min=1).double(), 1.0)


def damage(got: torch.Tensor, expected: torch.Tensor, need: torch.Tensor) -> Damage | None:
    """The `Damage` of a selection whose sorted values are `got` against `expected`, `need` values per
    row (as `row_recall` takes them); None when every row holds exactly the expected values."""
    wrong = (got != expected).any(1)
    if not bool(wrong.any()):
        return None
    recall = row_recall(got, expected, need)
    counted = recall[need > 0]
    finite = torch.isfinite(got) & torch.isfinite(expected)
    deficit = torch.where(finite, expected - got, 0.0)
    return Damage(recall_min=float(counted.min()) if counted.numel() else 1.0,
                  recall_mean=float(counted.mean()) if counted.numel() else 1.0,
                  rows=int(wrong.sum()), of_rows=int(got.shape[0]),
                  max_deficit=float(deficit.max()) if deficit.numel() else 0.0)


__all__ = ["Damage", "damage", "row_recall"]
