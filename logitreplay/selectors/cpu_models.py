"""Vectorized CPU models of the three bundled selection algorithms, with work counters.

These are not fast top-k implementations: they replay, row-batched in torch, the decisions each GPU
algorithm makes, so that on a machine without a GPU a user can still see *why* a selector will be slow
on their logits (how many histogram passes native needs, how often DeepSelect compacts its buffer), and
so that the selections they produce are verified like any kernel's. Rows are processed in chunks of at
most `_CHUNK_CELLS` cells; within a chunk every step is a whole-tensor operation (no loop per element).

- `native_topk`: vLLM's prefill histogram radix-select. Pass 1 bins the top 11 bits of the value
  converted to fp16 (2048 bins) and is kept only if it finishes; passes 2-4 bin fp32 bits 31-21 of every
  element, then 20-10 and 9-0 among the elements that matched every fp32 bin fixed so far (as native.cu
  does). After each pass, elements above the threshold bin are emitted; once the
  threshold bin holds <= `NATIVE_FINAL_ITEMS` elements (or after the last pass, when it holds only exact
  ties) it is finished by a sort. Values concentrated in few fp16 bins (scores + 100, scores * 1e-8) keep
  the threshold bin large and force the extra passes.
- `deepselect_topk`: DeepSelect's pass as deepselect.cu makes it, with its configuration
  (`deepselect_config`: segment and round sizes, buffer capacity) and its visit order of segments
  (`deepselect_round_columns`). The first round sets the threshold T to its key of rank `keep_rank`
  (about the share of the row's top k it holds, plus a margin: a bet that T is still at or below the
  row's k-th value), and the later rounds append every element at or above T to a candidate buffer,
  with no compaction but one: a long row looks at its buffer once, after an eighth of its rounds, and
  when the buffer is on course for more than half its capacity it is cut back speculatively (the same
  bet, placed on what was seen so far), or, already overflowed, the pass stops there. A row whose bet is
  lost (fewer than k candidates at the end) or whose buffer overflows is redone exactly: the first threshold at rank k, and whenever the buffer reaches k + the
  slack it is cut back to its k largest and T becomes the k-th value. A final select gives the result.
- `split_topk`: the split kernel's select. A first round bins every key by magnitude (`split_coarse_bin`:
  32 bins per octave of |x| in [2^-16, 2^16)); the bucket holding the k-th largest key is then resolved
  11 bits a round, each row stopping once its threshold digit's bucket is taken whole or holds one key
  value. A whole row (or, when the launch has more items than blocks, a split row) whose bucket has at
  most `SPLIT_LISTED` (`SPLIT_SLOT_LISTED`) keys finishes it with a shared-memory select after the first
  round instead. Its work also says how many blocks the kernel's plan cuts each row into (`split_plan`,
  for an H200's grid) and how many of them listed their bucket (a row listed is finished from its list,
  with no further round).

All compare values through order-preserving integer keys, as the kernels do, so ties and signed zeros
behave like the kernels' bit patterns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from logitreplay.archive import Case
from logitreplay.selectors import kernel_config

# The kernels' constants come from their configs (cuda/<kernel>_config.h, through kernel_config.py), the
# one copy the kernels include too.
_NATIVE, _SPLIT, _DS = (kernel_config.load(k) for k in ("native", "split", "deepselect"))
NATIVE_BINS = _NATIVE.constants["kBins"]
NATIVE_FINAL_ITEMS = _NATIVE.constants["kFinal"]
# The split kernel's plan on an H200: its grid (132 SMs, kBlocksPerSm blocks each), smallest chunk, key
# cache and the most rows it splits.
_H200_SMS = 132
SPLIT_GRID = _H200_SMS * _SPLIT.constants["kBlocksPerSm"]
SPLIT_SHARE_DIV = _SPLIT.constants["kShareDiv"]  # the least share of the grid the plan spreads elements over is grid / this
SPLIT_MIN_CHUNK = _SPLIT.constants["kMinChunk"]
SPLIT_CACHE_BYTES = _SPLIT.constants["kCacheBytes"]
SPLIT_ROWS = _SPLIT.constants["kSplitRows"]
SPLIT_PLAN_ITEMS = _SPLIT.constants["kPlanItems"]  # the items its plan indexes (split.cu's 16-bit PlanIndex)
SPLIT_LISTED = _SPLIT.constants["kListed"]  # the coarse bucket keys an item lists in shared memory
SPLIT_SLOT_LISTED = _SPLIT.constants["kSlotPairs"]  # a split row's, in its workspace slot, when its last part finishes it alone
_SPLIT_WINDOW = _SPLIT.constants["kWindow"]  # split's coarse bins: (exponent, top 5 mantissa bits) of 2^-16
_CHUNK_CELLS = 1 << 22
_NO_KEY = -(2**31)  # below every key: marks cells that are not candidates
_PERM_PRIME = _DS.constants["kPermPrime"]  # its residue modulo m is coprime with m
# deepselect: its top_k classes (and those with a wide variant), rows of at least DS_WIDE_STRIDE taking
# the wide one, and the key bits its first threshold and its selects resolve, (fp32, bf16).
DS_CLASSES = tuple(c["k_max"] for c in _DS.tables["kClasses"])
DS_WIDE_CLASSES = tuple(c["k_max"] for c in _DS.tables["kWideClasses"])
DS_WIDE_STRIDE = _DS.constants["kWideStride"]
DS_FIRST_BITS = (_DS.constants["kFirstBitsF32"], _DS.constants["kFirstBitsBf16"])
DS_KEY_BITS = (_DS.constants["kKeyBitsF32"], _DS.constants["kKeyBitsBf16"])


@dataclass
class NativeWork:
    """Per-row work of the native model: `passes` is the histogram pass (1-4) after which the threshold
    bin was small enough to finish (0 when the row had <= k elements and was copied whole);
    `final_sort` is how many elements that finishing sort handled."""

    passes: np.ndarray
    final_sort: np.ndarray


@dataclass
class DeepSelectWork:
    """Per-row work of the DeepSelect model: `compactions` of the candidate buffer, `appended`, the
    candidates that passed the threshold (the buffer traffic), `redone`, 1 for a row whose speculative
    pass was lost or overflowed and was read a second time (both passes counted), and `first_thresholds`,
    the passes whose first threshold came from the first round's registers (which needs the round to
    hold at least that threshold's rank of the row's elements)."""

    compactions: np.ndarray
    appended: np.ndarray
    redone: np.ndarray
    first_thresholds: np.ndarray


@dataclass
class SplitWork:
    """Per-row work of the split model: the histogram `rounds` (the coarse one, then up to 3 digits for
    fp32 and 2 for bf16; 0 when the row had <= k elements and was copied whole), the blocks (`parts`) the
    row was cut into, and how many of them `listed` its coarse bucket."""

    rounds: np.ndarray
    parts: np.ndarray
    listed: np.ndarray


def f32_key(x: torch.Tensor) -> torch.Tensor:
    """Order-preserving key of float32 values as a signed int32 (larger value -> larger key): the sign
    bit flips the other 31 bits of negatives. The kernels' uint32 key is this plus 2^31."""
    bits = x.contiguous().view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def f16_bin(x: torch.Tensor) -> torch.Tensor:
    """The 11-bit bin of native's first pass: top 11 bits of the order-preserving key of fp16(x)."""
    bits = x.to(torch.float16).view(torch.int16).to(torch.int32)
    key = bits ^ ((bits >> 15) & 0x7FFF)  # signed order key in [-2^15, 2^15)
    return (key >> 5) + 1024


def _valid_mask(starts: torch.Tensor, ends: torch.Tensor, cols: int) -> torch.Tensor:
    col = torch.arange(cols, dtype=torch.int64).unsqueeze(0)
    return (col >= starts.unsqueeze(1)) & (col < ends.unsqueeze(1))


def _chunks(rows: int, cols: int) -> list[tuple[int, int]]:
    step = max(1, _CHUNK_CELLS // max(cols, 1))
    return [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]


def _top_positions(score: torch.Tensor, top_k: int) -> torch.Tensor:
    """Column positions of each row's `top_k` highest scores (rows narrower than k padded with no-keys)."""
    if score.shape[1] < top_k:
        score = torch.cat([score, score.new_full((score.shape[0], top_k - score.shape[1]), _NO_KEY)], dim=1)
    return torch.topk(score, top_k, dim=1).indices


def _with_tails(rel: torch.Tensor, need: torch.Tensor) -> torch.Tensor:
    """int32 indices with every slot at or past `need` (min(k, row length)) set to -1."""
    slot = torch.arange(rel.shape[1], dtype=torch.int64).unsqueeze(0)
    return torch.where(slot < need.unsqueeze(1), rel, -1).to(torch.int32)


def _chunked(chunk: Callable[..., tuple[torch.Tensor, ...]], logits: torch.Tensor, row_starts: torch.Tensor,
             row_ends: torch.Tensor, top_k: int, *per_row: torch.Tensor) -> tuple[torch.Tensor, list[np.ndarray]]:
    """Run a model chunk function over row chunks of a (rows, cols) CPU matrix (bounded scratch memory),
    passing it the chunk's slice of each `per_row` tensor after top_k; returns the int32 (rows, top_k)
    indices and the per-row work counters it reports, as numpy arrays."""
    rows, cols = logits.shape
    out = torch.empty((rows, top_k), dtype=torch.int32)
    counters: list[np.ndarray] = []
    for r0, r1 in _chunks(rows, cols):
        ends = row_ends[r0:r1].to(torch.int64)
        # Only the columns before the chunk's last row end: a decode row is a few K of a 163840-wide
        # row, and the poisoned cells past every end are never looked at.
        width = min(cols, max(1, int(ends.max())))
        idx, *work = chunk(logits[r0:r1, :width].float(), row_starts[r0:r1].to(torch.int64), ends, top_k,
                           *(t[r0:r1] for t in per_row))
        out[r0:r1] = idx
        counters = counters or [np.zeros(rows, dtype=np.int64) for _ in work]
        for c, w in zip(counters, work, strict=True):
            c[r0:r1] = w.numpy()
    return out, counters


def native_topk(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                top_k: int) -> tuple[torch.Tensor, NativeWork]:
    """Run the native model on a (rows, cols) CPU matrix; returns int32 (rows, top_k) indices and work."""
    out, (passes, final) = _chunked(_native_chunk, logits, row_starts, row_ends, top_k)
    return out, NativeWork(passes, final)


def _digit(shift: int, bits: int) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, int]]:
    """A digit of the uint32 key (bits shift .. shift + bits - 1) as a bin in [0, 2^bits)."""

    def bins(x: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, int]:
        return ((key.to(torch.int64) + 2**31) >> shift) & ((1 << bits) - 1), 1 << bits

    return bins


# native: the fp16 pass, then fp32 bits 31-21, 20-10 and 9-0.
_NATIVE_STEPS = [lambda x, key: (f16_bin(x), NATIVE_BINS), _digit(21, 11), _digit(10, 11), _digit(0, 10)]


def _threshold_bins(slot: torch.Tensor, nbins: int, remaining: torch.Tensor,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row, the threshold bin of an (n, cols) tensor of bins (`nbins` marks cells not counted): the
    highest bin whose count from the top reaches `remaining`, the count above it and its own count."""
    n = slot.shape[0]
    hist = torch.zeros((n, nbins + 1), dtype=torch.int64).scatter_add_(1, slot, torch.ones_like(slot))[:, :nbins]
    at_or_above = hist.flip(1).cumsum(1).flip(1)
    t = ((at_or_above >= remaining.unsqueeze(1)).sum(1) - 1).clamp(min=0)
    above = torch.cat([at_or_above, at_or_above.new_zeros((n, 1))], 1).gather(1, (t + 1).unsqueeze(1)).squeeze(1)
    return t, above, hist.gather(1, t.unsqueeze(1)).squeeze(1)


def _native_chunk(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor,
                  top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """native's histogram radix select over `_NATIVE_STEPS` (each bins the candidates still in play): after
    each step the elements above the threshold bin are emitted, and a row stops once its threshold bin
    holds at most `NATIVE_FINAL_ITEMS` (or after the last step, when the bin holds only exact ties).
    Returns the indices, the steps each row took, and its last threshold bin's size."""
    n, cols = x.shape
    key = f32_key(x)
    valid = _valid_mask(starts, ends, cols)
    lengths = ends - starts
    need = torch.clamp(lengths, max=top_k)
    active = lengths > top_k  # shorter rows are copied whole, without a histogram
    emitted = valid & ~active.unsqueeze(1)
    cand = valid & active.unsqueeze(1)
    remaining = need.clone()
    passes = torch.zeros(n, dtype=torch.int64)
    final = torch.zeros(n, dtype=torch.int64)
    for step, bins in enumerate(_NATIVE_STEPS):
        if not bool(active.any()):
            break
        b, nbins = bins(x, key)
        slot = torch.where(cand & active.unsqueeze(1), b, nbins).to(torch.int64)  # bin nbins: the rest
        t, above, in_bin = _threshold_bins(slot, nbins, remaining)
        a = active.unsqueeze(1)
        emitted |= a & cand & (b > t.unsqueeze(1))
        cand = torch.where(a, cand & (b == t.unsqueeze(1)), cand)
        remaining = torch.where(active, remaining - above, remaining)
        passes = torch.where(active, step + 1, passes)
        done = active & ((in_bin <= NATIVE_FINAL_ITEMS) | (step == len(_NATIVE_STEPS) - 1))
        final = torch.where(done, in_bin, final)
        if step == 0:  # the fp16 pass keeps nothing unless it finishes: the next starts over on the row
            spent = (active & ~done).unsqueeze(1)
            emitted &= ~spent
            cand = torch.where(spent, valid, cand)
            remaining = torch.where(spent.squeeze(1), need, remaining)
        active &= ~done
    # Bins are ordered like values, so every emitted element outranks the threshold bin, whose finishing
    # sort takes the `remaining` largest: one top-k over emitted and threshold-bin keys is that result.
    score = torch.where(emitted | cand, key, _NO_KEY)
    return _with_tails(_top_positions(score, top_k) - starts.unsqueeze(1), need), passes, final


def split_plan(lengths: np.ndarray, top_k: int, key_bytes: int = 4, grid: int = SPLIT_GRID) -> np.ndarray:
    """The blocks the split kernel's plan cuts each row into: up to `SPLIT_ROWS` rows, the valid elements
    of all rows over the grid left to them (at least half of it), clamped between `SPLIT_MIN_CHUNK` and
    the keys its shared-memory cache holds (`SPLIT_CACHE_BYTES` / `key_bytes`); more rows stay whole."""
    lengths = np.clip(lengths.astype(np.int64), 0, None)
    if lengths.size > SPLIT_ROWS:
        return np.ones_like(lengths)
    share = max(grid - lengths.size, grid // SPLIT_SHARE_DIV)
    chunk = min(max(-(-int(lengths.sum()) // share), SPLIT_MIN_CHUNK), SPLIT_CACHE_BYTES // key_bytes)
    return np.where((lengths > top_k) & (lengths > chunk), np.minimum(-(-lengths // chunk), grid), 1)


def split_parts_bound(rows: int, cols: int, key_bytes: int) -> int:
    """The most parts `split_plan` can cut rows of at most `cols` elements into, on any grid, in the one
    case that can pass `SPLIT_PLAN_ITEMS`: items of a whole key cache each (smaller ones come from a chunk
    of at least total / share and number at most rows + grid). 0 past `SPLIT_ROWS`: no row is split."""
    if rows > SPLIT_ROWS:
        return 0
    return rows * -(-cols // (SPLIT_CACHE_BYTES // key_bytes))


def split_coarse_bin(key: torch.Tensor) -> torch.Tensor:
    """split's first digit: the coarse bin (0-2047) of the uint32 order key (int64 tensor), sign, 5
    exponent and 5 mantissa bits of |x| in [2^-16, 2^16), magnitudes outside in the outermost bins."""
    positive = key >> 31
    magnitude = torch.where(positive == 1, key, ~key) & 0x7FFFFFFF
    f = ((magnitude >> 18) - _SPLIT_WINDOW).clamp(0, 1023)
    return torch.where(positive == 1, 1024 + f, 1023 - f)


def split_coarse_range(bin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The uint32 keys [lo, hi] of split's coarse bins (int64 tensors)."""
    f = torch.where(bin >= 1024, bin - 1024, 1023 - bin)
    lo = torch.where(f == 0, 0, (_SPLIT_WINDOW + f) << 18)
    hi = torch.where(f == 1023, 0x7FFFFFFF, ((_SPLIT_WINDOW + f + 1) << 18) - 1)
    return torch.where(bin >= 1024, lo | 2**31, ~hi & 0x7FFFFFFF), torch.where(bin >= 1024, hi | 2**31, ~lo & 0x7FFFFFFF)


def _bit_length(x: torch.Tensor) -> torch.Tensor:
    """Bits of non-negative int64 values below 2^53 (0 for 0)."""
    return torch.where(x > 0, torch.frexp(x.to(torch.float64)).exponent.to(torch.int64), 0)


def _split_chunk(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, top_k: int, parts: torch.Tensor,
                 alone: torch.Tensor, unused: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """split.cu's select on a chunk of rows: `parts` per row from the plan, `alone` where a split row's last
    part finishes a listed bucket alone, keys `unused` low bits short (16 for bf16 values)."""
    n, cols = x.shape
    signed = f32_key(x)
    key = (signed.to(torch.int64) + 2**31) >> unused  # the kernel's key: 32 or 16 bits
    valid = _valid_mask(starts, ends, cols)
    lengths = ends - starts
    active = lengths > top_k  # shorter rows are copied whole
    lanes = valid & active.unsqueeze(1)
    t, above, count = _threshold_bins(torch.where(lanes, split_coarse_bin(key << unused), 2048), 2048,
                                      torch.full((n,), top_k, dtype=torch.int64))
    lo, hi = (b >> unused for b in split_coarse_range(t))
    need = top_k - above
    in_bucket = lanes & (key >= lo.unsqueeze(1)) & (key <= hi.unsqueeze(1))
    # Rows that list their bucket, every part of them: a whole row, or a split row finished by its last part
    # alone (parts resolving a row together go on digit by digit over their caches).
    finished_alone = (need < count) & active & ((parts == 1) | alone)
    finished_alone &= count <= torch.where(parts == 1, SPLIT_LISTED, SPLIT_SLOT_LISTED)
    listed = torch.where(finished_alone, parts, 0)
    rounds = torch.where(active, 1, 0)
    going = active & ~finished_alone & (need < count) & (lo != hi)
    while bool(going.any()):
        top = _bit_length(lo ^ hi)
        bits = top.clamp(max=11)
        shift = top - bits
        digit = (key >> shift.unsqueeze(1)) & (torch.bitwise_left_shift(torch.ones_like(bits), bits).unsqueeze(1) - 1)
        d, d_above, d_count = _threshold_bins(torch.where(in_bucket & going.unsqueeze(1), digit, 2048), 2048, need)
        prefix = ((lo >> top) << top) | (d << shift)
        lo = torch.where(going, torch.maximum(lo, prefix), lo)
        hi = torch.where(going, torch.minimum(hi, prefix | (torch.bitwise_left_shift(torch.ones_like(shift), shift) - 1)), hi)
        need = torch.where(going, need - d_above, need)
        count = torch.where(going, d_count, count)
        rounds += going.to(torch.int64)
        in_bucket &= (key >= lo.unsqueeze(1)) & (key <= hi.unsqueeze(1))
        going &= (need < count) & (lo != hi)
    # Keys above the final bucket are all taken and the bucket's `need` largest after them (ties in any
    # order): one top-k over the keys from the bucket up is that result.
    score = torch.where(lanes & (key >= lo.unsqueeze(1)), signed, _NO_KEY)
    score = torch.where(valid & ~active.unsqueeze(1), signed, score)
    out = _with_tails(_top_positions(score, top_k) - starts.unsqueeze(1), torch.clamp(lengths, max=top_k))
    return out, rounds, listed


def split_topk(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
               top_k: int) -> tuple[torch.Tensor, SplitWork]:
    """Run the split model on a (rows, cols) CPU matrix; returns int32 (rows, top_k) indices and work."""
    bf16 = logits.dtype == torch.bfloat16
    parts = split_plan((row_ends - row_starts).numpy(), top_k, 2 if bf16 else 4)
    # A split row's last part finishes a small bucket alone when blocks have other items to take.
    alone = np.full(parts.shape, parts.size <= SPLIT_ROWS and int(parts.sum()) > SPLIT_GRID)
    unused = 16 if bf16 else 0

    def chunk(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, k: int, p: torch.Tensor,
              a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return _split_chunk(x, starts, ends, k, p, a, unused)

    out, (rounds, listed) = _chunked(chunk, logits, row_starts, row_ends, top_k, torch.from_numpy(parts),
                                   torch.from_numpy(alone))
    return out, SplitWork(rounds, parts, listed)


@dataclass(frozen=True)
class DeepSelectConfig:
    """deepselect.cu's compile-time configuration for one launch (its `Config`): chosen by the top_k class
    and, for the wide variant, by the row stride (the bounds stay on the device)."""

    k_max: int  # the top_k class: 512, 1024, 2048 or 4096
    elems: int  # elements per thread per round
    warps: int  # warps per block
    slack: int  # candidates since the last compaction that trigger the next one (kB2)
    rebets: bool  # whether its free rounds re-bet (kRebets): not the narrow variant of a wide class
    rebet_rounds: int  # the fewest rounds of a row that re-bets (kRebetRounds) ...
    rebet_div: int  # ... after round rounds // rebet_div (kRebetDiv)

    @property
    def segment(self) -> int:
        """Elements of one warp's share of a round."""
        return 32 * self.elems

    @property
    def round(self) -> int:
        return self.warps * self.segment

    @property
    def cap(self) -> int:
        """The candidate buffer: never reached by a synchronous round, overflowed by a free one."""
        return self.k_max + self.slack + self.round

    def rebet_round(self, rounds: torch.Tensor) -> torch.Tensor:
        """Per row of `rounds` rounds: the free round after which it re-bets (deepselect.cu's free_rounds
        ends its first run of rounds there), -1 for a row that does not."""
        return torch.where((rounds >= self.rebet_rounds) & self.rebets, rounds // self.rebet_div, -1)


def deepselect_config(top_k: int, row_stride: int,
                      config: kernel_config.KernelConfig = _DS) -> DeepSelectConfig:
    """The kernel's configuration for this top_k and row stride: the first class of deepselect_config.h
    (or another `config` of its form) whose k_max is at least top_k (the last takes the rest), its wide
    row where `_wide` says so."""
    classes = [c["k_max"] for c in config.tables["kClasses"]]
    k_max = next(c for c in classes if top_k <= c or c == classes[-1])
    wide = _wide(config, k_max, row_stride)
    row = next(c for c in config.tables["kWideClasses" if wide else "kClasses"] if c["k_max"] == k_max)
    threads, elems = row["threads"], row["elems"]
    return DeepSelectConfig(k_max, elems, threads // 32, row["b2"], _rebets(config, k_max, wide, threads * elems),
                            config.constants["kRebetRounds"], config.constants["kRebetDiv"])


def _has_wide(config: kernel_config.KernelConfig, k_max: int) -> bool:
    """deepselect.cu's has_wide: whether class k_max has a wide variant (a row of kWideClasses)."""
    return any(c["k_max"] == k_max for c in config.tables["kWideClasses"])


def _wide(config: kernel_config.KernelConfig, k_max: int, row_stride: int) -> bool:
    """deepselect.cu's launch_class, its choice over the same config values: class k_max's wide variant
    where it has one and the row stride is at least kWideStride (the stride, since the bounds stay on the
    device), its narrow one otherwise. tests/test_kernel_constants.py evaluates the kernel's own
    conditions against this one."""
    return _has_wide(config, k_max) and row_stride >= config.constants["kWideStride"]


def _rebets(config: kernel_config.KernelConfig, k_max: int, wide: bool, round_elems: int) -> bool:
    """deepselect.cu's kRebets, its rule over the same config values: whether a row of the variant can
    be long enough to re-bet. The narrow variant of a class with a wide one serves rows shorter than
    kWideStride only (rows do not overlap), at most kWideStride / kRound + 1 rounds; where that is fewer
    than kRebetRounds the kernel compiles it without the re-bet. tests/test_kernel_constants.py
    evaluates the kernel's own expression against this one."""
    c = config.constants
    return wide or not _has_wide(config, k_max) or c["kWideStride"] // round_elems + 1 >= c["kRebetRounds"]


def deepselect_round_columns(cfg: DeepSelectConfig, length: int, head: int, r: int) -> torch.Tensor:
    """The columns (relative to the row start) of a row of `length` elements that round `r` reads: warp w
    reads segment (i * a + m / 2) mod m, i = r * warps + w, a = P mod m, of the span that starts `head`
    elements before the row (at the 16-byte boundary at or before the row start)."""
    idx, inside = _round_columns(cfg, torch.tensor([length]), torch.tensor([head]), r)
    return idx[0][inside[0]]


def _round_columns(cfg: DeepSelectConfig, lengths: torch.Tensor, heads: torch.Tensor,
                   r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the columns round `r` reads (n, round) and which of them lie inside the row."""
    span = lengths + heads
    m = ((span + cfg.segment - 1) // cfg.segment).clamp(min=1).unsqueeze(1)
    i = r * cfg.warps + torch.arange(cfg.warps, dtype=torch.int64).unsqueeze(0)
    seg = (i * (_PERM_PRIME % m) + m // 2) % m
    lane = torch.arange(cfg.segment, dtype=torch.int64)
    idx = (seg.unsqueeze(2) * cfg.segment + lane).reshape(len(lengths), -1) - heads.unsqueeze(1)
    has = (i < m).repeat_interleave(cfg.segment, dim=1)
    return idx, has & (idx >= 0) & (idx < lengths.unsqueeze(1))


def keep_rank(top_k: int, seen: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """deepselect.cu's speculative rank after `seen` of a row's `length` elements: of the row's top_k
    about mu = top_k * seen / length were seen, and the rank mu + kRankSigmas sqrt(mu) + kRankExtra (at
    most top_k) is with overwhelming probability still at or below the row's k-th value."""
    mu = torch.tensor(top_k, dtype=torch.float32) * seen.float() / length.clamp(min=1).float()
    sigmas, extra = _DS.constants["kRankSigmas"], _DS.constants["kRankExtra"]
    return torch.ceil(mu + sigmas * mu.sqrt() + extra).clamp(max=top_k).to(torch.int64)  # fp32, as the kernel


def deepselect_topk(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                    top_k: int) -> tuple[torch.Tensor, DeepSelectWork]:
    """Run the DeepSelect model on a (rows, cols) CPU matrix; returns int32 (rows, top_k) indices and work."""
    cfg = deepselect_config(top_k, logits.stride(0))
    bf16 = logits.dtype == torch.bfloat16
    # Each row's head: its start's offset from a 16-byte boundary, in elements (the buffer is aligned).
    rows = torch.arange(logits.shape[0], dtype=torch.int64)
    heads = (rows * logits.stride(0) + row_starts.to(torch.int64)) % (8 if bf16 else 4)

    def chunk(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, k: int,
              h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, compactions, appended, firsts, lost = _deepselect_pass(x, starts, ends, h, k, cfg, bf16, True)
        if bool(lost.any()):
            rows = lost.nonzero().squeeze(1)
            again, *more, _ = _deepselect_pass(x[rows], starts[rows], ends[rows], h[rows], k, cfg, bf16, False)
            out[rows] = again
            for total, extra in zip((compactions, appended, firsts), more, strict=True):
                total[rows] += extra
        return out, compactions, appended, lost.to(torch.int64), firsts

    out, counters = _chunked(chunk, logits, row_starts, row_ends, top_k, heads)
    return out, DeepSelectWork(*counters)


def _rank_key(ranked: torch.Tensor, rank: torch.Tensor, key_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of descending keys: the threshold prefix common.cuh's radix_select_rule finds for the `rank`
    largest, and how many keys are at or above it. The select resolves 8 bits at a time from the top and
    stops at the first digit whose bucket is taken whole, so the prefix is the rank-th key with the bits
    below that digit (at least those below `key_bits`) cleared: a lower threshold than the key itself,
    which lets more of a row's later elements in."""
    kth = ranked.gather(1, (rank - 1).clamp(0, ranked.shape[1] - 1).unsqueeze(1)).squeeze(1)
    prefix, count = kth, torch.zeros_like(kth)
    done = torch.zeros(kth.shape, dtype=torch.bool)
    for bits in range(8, key_bits + 1, 8):
        at = kth & ~((1 << (32 - bits)) - 1)
        not_below = (ranked >= at.unsqueeze(1)).sum(1)
        stop = ~done & ((not_below == rank) | (bits == key_bits))
        prefix, count = torch.where(stop, at, prefix), torch.where(stop, not_below, count)
        done |= stop
    return prefix, count


def _deepselect_pass(x: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, heads: torch.Tensor, top_k: int,
                     cfg: DeepSelectConfig, bf16: bool,
                     speculate: bool) -> tuple[torch.Tensor, ...]:
    """One pass over the rows: (indices, compactions, appended, first, lost), first marking the rows whose
    first threshold came from the first round, lost the rows to redo.
    Keys are the kernel's unsigned order keys (as int64; -1 marks an empty buffer cell). Its selects
    resolve bf16 keys to 16 bits (all they carry), fp32 keys to 32, and the first threshold to 24."""
    first_bits, select_bits = DS_FIRST_BITS[bf16], DS_KEY_BITS[bf16]
    n, width = x.shape
    key = f32_key(x).to(torch.int64) + 2**31
    lengths = ends - starts
    need = torch.clamp(lengths, max=top_k)
    span = lengths + heads
    rounds = ((span + cfg.segment - 1) // cfg.segment + cfg.warps - 1) // cfg.warps
    selecting = lengths > top_k  # the kernel copies shorter rows whole
    cap, limit = cfg.cap, top_k + cfg.slack
    buf_key = torch.full((n, cap + 1), -1, dtype=torch.int64)  # column `cap` absorbs rejected writes
    buf_idx = torch.zeros((n, cap + 1), dtype=torch.int64)
    count = torch.zeros(n, dtype=torch.int64)
    lowest = torch.full((n,), -1, dtype=torch.int64)  # an element enters at or above this key
    free = torch.zeros(n, dtype=torch.bool)  # speculating: no compaction, overflow means a redo
    rebet_round = cfg.rebet_round(rounds)
    reading = torch.ones(n, dtype=torch.bool)  # a free pass that overflowed by its re-bet stops reading
    compactions = torch.zeros(n, dtype=torch.int64)
    appended = torch.zeros(n, dtype=torch.int64)
    first = torch.zeros(n, dtype=torch.bool)
    full_rank = torch.full((n,), top_k, dtype=torch.int64)
    for r in range(int(rounds.max()) if n else 0):
        idx, inside = _round_columns(cfg, lengths, heads, r)
        k = key.gather(1, (starts.unsqueeze(1) + idx).clamp(0, max(width - 1, 0)))
        later = lowest
        if r == 0:  # the first threshold, from the round's own keys
            rank = keep_rank(top_k, torch.full((n,), cfg.round), span) if speculate else full_rank
            first = selecting & (rounds > 1) & (rank <= inside.sum(1))  # the round holds rank keys
            prefix, not_below = _rank_key(torch.where(inside, k, -1).sort(dim=1, descending=True).values, rank,
                                          first_bits)
            lowest = torch.where(first, prefix, lowest)
            # At least top_k keys at or above the prefix: later rounds need none equal to it.
            later = torch.where(first & (not_below >= top_k), prefix + 1, lowest)
            free = first & speculate
        take = inside & (k >= lowest.unsqueeze(1)) & reading.unsqueeze(1)
        lowest = later
        got = take.sum(1)
        pos = torch.where(take, count.unsqueeze(1) + take.cumsum(1) - 1, cap).clamp(max=cap)
        buf_key.scatter_(1, pos, torch.where(take, k, -1))
        buf_idx.scatter_(1, pos, idx)
        count += got
        appended += got
        full = ~free & (count >= limit) & (r + 1 < rounds)
        seen = span.clamp(max=(r + 1) * cfg.round)
        rebet = free & (rebet_round == r)
        reading &= ~(rebet & (count > cap))
        spec_rank = keep_rank(top_k, seen, span)
        full |= rebet & (count <= cap) & (count * rounds > (r + 1) * (cap // 2)) & (count > spec_rank)
        if bool(full.any()):
            rows = full.nonzero().squeeze(1)
            ranked, order = torch.sort(buf_key[rows, :cap], dim=1, descending=True)
            rank = spec_rank[rows] if speculate else full_rank[rows]
            at, not_below = _rank_key(ranked, rank, select_bits)
            exact = not_below >= top_k  # the rank-th key is also the k-th: keep top_k, later ones above it
            keep = torch.where(exact, top_k, not_below)
            kept = torch.arange(cap, dtype=torch.int64).unsqueeze(0) < keep.unsqueeze(1)
            buf_key[rows, :cap] = torch.where(kept, ranked, -1)
            buf_idx[rows, :cap] = buf_idx[rows].gather(1, order)
            count[rows] = keep
            lowest[rows] = torch.maximum(lowest[rows], torch.where(exact, at + 1, at))
            compactions[rows] += 1
    pos = _top_positions(buf_key[:, :cap], top_k).clamp(max=cap)  # past `cap` only in -1 tail slots
    out = _with_tails(buf_idx.gather(1, pos), need)
    return out, compactions, appended, first.to(torch.int64), selecting & ((count > cap) | (count < need))


def lowest_index_first(logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor,
                       selected: torch.Tensor) -> torch.Tensor:
    """The output of a `-det` selector from a selection `selected` (int32 (rows, k)) whose values are right,
    as the kernels' deterministic apply makes it (common.cuh, `det_*`): per row every element above the
    selection's k-th value, then as many of the elements tied at that value as the selection took, the
    lowest indices first (the index set of a stable sort), all in ascending index order, -1 after them.
    -0.0 and +0.0 tie (the kernels add +0.0 to every value before keying it, in that mode only)."""
    rows, cols = logits.shape
    top_k = selected.shape[1]
    out = torch.full((rows, top_k), -1, dtype=torch.int32)
    for r0, r1 in _chunks(rows, cols):
        starts, ends = row_starts[r0:r1].to(torch.int64), row_ends[r0:r1].to(torch.int64)
        width = min(cols, max(1, int(ends.max()) if r1 > r0 else 1))
        valid = _valid_mask(starts, ends, width)
        key = torch.where(valid, f32_key(logits[r0:r1, :width].float() + 0.0).to(torch.int64), _NO_KEY - 1)
        sel = selected[r0:r1].to(torch.int64)
        took = sel >= 0
        picked = key.gather(1, torch.where(took, starts.unsqueeze(1) + sel, 0).clamp(0, width - 1))
        kth = torch.where(took, picked, 2**32).amin(1)  # no selection: nothing is above it
        above = valid & (key > kth.unsqueeze(1))
        tied = valid & (key == kth.unsqueeze(1))
        ties = took.sum(1) - above.sum(1)
        chosen = above | (tied & (tied.cumsum(1) <= ties.unsqueeze(1)))
        col = torch.arange(width, dtype=torch.int64).unsqueeze(0)
        first = torch.where(chosen, col, width).sort(dim=1).values[:, :top_k]
        n = first.shape[1]
        out[r0:r1, :n] = torch.where(first < width, first - starts.unsqueeze(1), -1).to(torch.int32)
    return out


def case_work(case: Case) -> dict[str, float]:
    """The models' work counters on one case, summarised over its rows (what `inspect --work` shows):
    native's histogram passes (mean, max) and finishing-sort size, DeepSelect's compactions (mean, max)
    and candidates appended per row, split's histogram rounds (mean, max), blocks per row (mean, max) and
    the share of a selected row's blocks that listed its coarse bucket."""
    logits = case.padded()
    starts, ends = torch.from_numpy(case.row_starts), torch.from_numpy(case.row_ends)
    _, nw = native_topk(logits, starts, ends, case.top_k)
    _, dw = deepselect_topk(logits, starts, ends, case.top_k)
    _, sw = split_topk(logits, starts, ends, case.top_k)

    def mean(a: np.ndarray) -> float:
        return float(a.mean()) if a.size else 0.0

    def peak(a: np.ndarray) -> float:
        return float(a.max()) if a.size else 0.0

    return {
        "native_passes_mean": mean(nw.passes),
        "native_passes_max": peak(nw.passes),
        "native_final_sort_mean": mean(nw.final_sort),
        "deepselect_compactions_mean": mean(dw.compactions),
        "deepselect_compactions_max": peak(dw.compactions),
        "deepselect_appended_mean": mean(dw.appended),
        "deepselect_redone_mean": mean(dw.redone),
        "split_rounds_mean": mean(sw.rounds),
        "split_rounds_max": peak(sw.rounds),
        "split_parts_mean": mean(sw.parts),
        "split_parts_max": peak(sw.parts),
        "split_listed_mean": mean((sw.listed / sw.parts)[sw.rounds > 0]),
    }
