"""Which tied indices a selector returns, and whether two selectors return the same index sets.

At a row's k-th value a selection may take any of the candidates tied there, so two selectors that both
verify (checks 1-7 judge values) can select different KV blocks. For every case this module counts the
candidates tied at each row's k-th value (`Ties`; `logitreplay inspect` counts the same, on sampled rows,
with `kth_tie_mask` too); for every selector whose values are right, whether its choice among them follows a
policy, over every row where there was a choice to make:

- "lowest": the lowest indices among the tied candidates (the index set a stable sort gives);
- "highest": the highest ones;
- "none observed": neither, in some row (a policy of another kind, or none);
- None: no row of the case had more tied candidates than the selection takes.

and for every pair of them, the fraction of rows whose index sets agree (`Agreement`). Selectors may
run in processes of their own (`--isolate`, peers from other builds), so each selector's index sets
travel as one digest per row (`row_digests`) and the agreement is found where the results meet
(`agreement`).

What a policy proves: on these rows the selector chose that way every time. What it cannot: that it
always will (a kernel that takes the lowest indices while a row fits in one block may not beyond), nor
that it chooses so run after run: that is `--determinism`'s question. Rows are processed in chunks, as
`expected_values` does, so a full-scale case needs no second full-size matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from logitreplay.datasets.summary import kth_tie_mask

_CHUNK_CELLS = 1 << 24
LOWEST, HIGHEST, NONE_OBSERVED = "lowest", "highest", "none observed"


@dataclass(frozen=True)
class Ties:
    """The candidates tied at each row's k-th value, over the rows longer than k: `rows_with_choice`
    rows hold more of them than the selection takes, of `rows_longer` rows longer than k; `tied_max`
    and `tied_mean` count the tied candidates of a row, the k-th value itself included."""

    rows_with_choice: int
    rows_longer: int
    tied_max: int
    tied_mean: float


@dataclass(frozen=True)
class Agreement:
    """The fraction `rows` of a case's rows whose index sets (as sets) two selectors agree on."""

    a: str
    b: str
    rows: float


def _chunk_policies(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, expected: torch.Tensor,
                    outputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """For one chunk of rows: tied counts, whether the row offers a choice, and per selector a (rows, 2)
    bool of (its tied picks are the lowest, the highest) among the tied candidates."""
    k = expected.shape[1]
    lengths = (ends - starts).to(torch.int64)
    longer = lengths > k
    kth = expected[:, 0]  # the k-th largest value of a row longer than k
    col = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
    inside = (col >= starts.unsqueeze(1)) & (col < ends.unsqueeze(1))
    tied_mask = kth_tie_mask(logits, inside & longer.unsqueeze(1), kth)
    tied = tied_mask.sum(1)
    taken = (expected == kth.unsqueeze(1)).sum(1)
    choice = longer & (tied > taken)
    policies = {}
    for name, idx in outputs.items():
        absolute = starts.unsqueeze(1).to(torch.int64) + idx.to(torch.int64)
        valid = idx >= 0
        picked = logits.gather(1, torch.where(valid, absolute, 0).clamp(max=max(logits.shape[1] - 1, 0))).float()
        tied_pick = valid & (picked == kth.unsqueeze(1))
        high = torch.where(tied_pick, absolute, -1).max(1).values
        low = torch.where(tied_pick, absolute, logits.shape[1]).min(1).values
        lowest = (tied_mask & (col <= high.unsqueeze(1))).sum(1) == taken
        highest = (tied_mask & (col >= low.unsqueeze(1))).sum(1) == taken
        policies[name] = torch.stack([lowest, highest], 1)
    return tied, choice, policies


def tie_report(logits: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, expected: torch.Tensor,
               outputs: Mapping[str, torch.Tensor]) -> tuple[Ties, dict[str, str | None]]:
    """The case's `Ties` and each selector's policy (module docstring), from the output views `outputs`
    of the selectors whose values are right (name -> int32 (rows, k); none: the ties alone)."""
    rows, cols = logits.shape
    k = expected.shape[1]
    step = max(1, _CHUNK_CELLS // max(cols, 1))
    tied_all, choice_all = [], []
    policy_rows: dict[str, list[torch.Tensor]] = {name: [] for name in outputs}
    for r0 in range(0, rows if cols else 0, step):  # no columns: no ties, and nothing to gather from
        r1 = min(rows, r0 + step)
        tied, choice, policies = _chunk_policies(logits[r0:r1], starts[r0:r1], ends[r0:r1], expected[r0:r1],
                                                 {n: o[r0:r1] for n, o in outputs.items()})
        tied_all.append(tied)
        choice_all.append(choice)
        for name, p in policies.items():
            policy_rows[name].append(p)
    longer = (ends - starts).to(torch.int64) > k
    tied = torch.cat(tied_all) if tied_all else torch.zeros(rows, dtype=torch.int64, device=expected.device)
    choice = torch.cat(choice_all) if choice_all else torch.zeros(rows, dtype=torch.bool, device=expected.device)
    counted = tied[longer]
    ties = Ties(int(choice.sum()), int(longer.sum()), int(counted.max()) if counted.numel() else 0,
                float(counted.double().mean()) if counted.numel() else 0.0)
    policy: dict[str, str | None] = {}
    for name, parts in policy_rows.items():
        chosen = torch.cat(parts)[choice] if parts else torch.zeros((0, 2), dtype=torch.bool)  # no rows: no choice
        policy[name] = None if not chosen.numel() else LOWEST if bool(chosen[:, 0].all()) else \
            HIGHEST if bool(chosen[:, 1].all()) else NONE_OBSERVED
    return ties, policy


# The multiplier of the per-row digest: odd, so that no slot's weight is 0 modulo 2^64.
_MULTIPLIER = 0x9E3779B97F4A7C15


def row_digests(out: torch.Tensor) -> np.ndarray:
    """One int64 per row of an output view: a digest of the row's index set (its sorted indices, weighted
    by powers of an odd multiplier, wrapping at 64 bits), equal for equal sets on every device and in
    every process; unequal sets collide with a chance of about 2^-64 per pair of rows."""
    with np.errstate(over="ignore"):
        powers = np.cumprod(np.full(out.shape[1], _MULTIPLIER, dtype=np.uint64)) if out.shape[1] else np.ones(0)
    weights = torch.from_numpy(powers.astype(np.uint64).view(np.int64))
    sets = out.sort(dim=1).values.to(torch.int64) + 2  # -1 fills weigh too
    return (sets * weights.to(out.device)).sum(1).cpu().numpy()


def agreement(digests: Mapping[str, np.ndarray]) -> list[Agreement]:
    """Per pair of selectors (in the order given), the fraction of rows whose `row_digests` agree."""
    names = list(digests)
    return [Agreement(a, b, float(np.mean(digests[a] == digests[b])) if digests[a].size else 1.0)
            for i, a in enumerate(names) for b in names[i + 1:]]


__all__ = ["HIGHEST", "LOWEST", "NONE_OBSERVED", "Agreement", "Ties", "agreement", "row_digests", "tie_report"]
