"""Deterministic synthetic control suites.

Real captured logits are the point of logitreplay; these controls exist to *explain* what real logits
do to a selector: the same shapes with normal-random scores, the distribution ablation that collapses
fp16 histogram bins (+100, *1e-8), and the edge cases (ties, zeros, short rows, multi-request chunks,
padded strides) that break selectors. Every case records its recipe, and a recipe regenerates its case
bit for bit (numpy's PCG64 stream is stable across platforms and releases).

The `decode` suites hold decode top-k calls as serving makes them for DeepSeek V3.2 / V4 (`DecodeRecipe`):
batch x next_n rows of a max_model_len = 163840 wide matrix, every row far shorter than the width, with the
decode facts (`archive/decode.py`) recorded on each case.

The `indexer` suites hold scores made as a DSA indexer makes them (`datasets/indexer.py`: per-head q.k of
the real head counts and dims, FP8-rounded q and k, ReLU, per-head weights, the sum, with sink tokens,
recency and repeated text): `indexer` prefill chunks (causal rows at the end of a sequence) and
`indexer-decode` decode batches (lengths mixed between 1K and 160K); every parameter is in the recipe.
`stress` also holds flooded rows (`FloodRecipe`): the top values of every row in one coarse histogram
bin, as many of them as the kernels' capacities and one more.

The long-context suites hold the same kinds of cases at 256K-1M columns, where DSA is used: `long` prefill
chunks of 2^27 cells (262144 x 512, 524288 x 256, 1048576 x 128, and a 1M chunk of three requests) and
`long-decode` batches of 1-256 rows of a 2^20-wide matrix (next_n 1 and 2, k 512/1024/2048, lengths 1K to
the width, edge rows shorter than next_n and k), indexer-made with a normal twin each, and the flooded rows
of `stress` at 2^20 columns, plus one far past every capacity.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch

from logitreplay.archive import Case, DecodeFacts
from logitreplay.datasets.indexer import Indexer, IndexerModel
from logitreplay.selectors.cpu_models import SPLIT_SLOT_LISTED, deepselect_config

SCALES: tuple[str, ...] = ("small", "full")
# Small scale divides rows and columns by this factor, keeping their ratio, so a CPU runs the suite in
# seconds; top_k is kept unless it would exceed half the (shrunk) width.
SMALL_DIVISOR = 8


@dataclass(frozen=True)
class Recipe:
    """Everything needed to regenerate one synthetic case."""

    suite: str
    group: str
    distribution: str  # normal | normal+100 | normal*1e-8 | relu | ties | low10
    rows: int
    cols: int
    top_k: int
    ends: str  # causal: cols - rows + i + 1 | diagonal: i + 1 | ramp: max(1, (i+1)*cols//rows) | edges
    seed: int
    dtype: str = "float32"
    starts: str = "zero"  # zero | requests (a multi-request chunk: each request's rows start at its KV)
    row_stride: int | None = None

    @property
    def case_id(self) -> str:
        dist = self.distribution.replace("+", "plus").replace("*", "times")
        parts = [self.group, dist, f"c{self.cols}", f"r{self.rows}", f"k{self.top_k}"]
        if self.dtype != "float32":
            parts.append("bf16")
        if self.starts != "zero":
            parts.append(self.starts)
        if self.ends == "edges":
            parts.append("edges")
        if self.row_stride is not None:
            parts.append(f"s{self.row_stride}")
        return "-".join(parts)

    def shrunk(self) -> Recipe:
        rows = max(1, self.rows // SMALL_DIVISOR)
        cols = max(1, self.cols // SMALL_DIVISOR)
        stride = None if self.row_stride is None else _deepgemm_stride(cols)
        return replace(self, rows=rows, cols=cols, top_k=min(self.top_k, max(1, cols // 2)), row_stride=stride)


def _deepgemm_stride(cols: int) -> int:
    """DeepGEMM pads logits rows to align(cols + 256, 256)."""
    return (cols + 256 + 255) // 256 * 256


def _seed_controls() -> list[Recipe]:
    r: list[Recipe] = []
    s = "seed-controls"
    for i, cols in enumerate((8192, 51200, 102400)):
        r.append(Recipe(s, "a", "normal", 4096, cols, 512, "causal", 100 + i))
    for dist in ("normal", "normal+100", "normal*1e-8"):
        # One seed for the ablation: the three cases hold the same draws, transformed.
        r.append(Recipe(s, "b", dist, 8192, 8192, 512, "diagonal", 200))
    for i, (cols, rows) in enumerate(((4096, 8192), (8192, 8192), (25600, 2048), (51200, 2048), (102400, 1310))):
        r.append(Recipe(s, "c", "normal", rows, cols, 512, "causal" if rows <= cols else "ramp", 300 + i))
    r.append(Recipe(s, "d", "normal", 4096, 65536, 2048, "causal", 400))
    return r


def _stress() -> list[Recipe]:
    s = "stress"
    base = {"suite": s, "rows": 1024, "cols": 16384, "top_k": 512, "ends": "causal"}
    r = [Recipe(group="dist", distribution=d, seed=500 + i, **base)  # type: ignore[arg-type]
         for i, d in enumerate(("relu", "ties", "low10"))]
    r += [Recipe(group="bf16", distribution=d, seed=510 + i, dtype="bfloat16", **base)  # type: ignore[arg-type]
          for i, d in enumerate(("normal", "relu", "ties"))]
    r.append(Recipe(s, "edges", "normal", 1024, 16384, 512, "edges", 520))
    r.append(Recipe(s, "edges", "normal", 1024, 16384, 512, "edges", 521, dtype="bfloat16"))
    r.append(Recipe(s, "chunk", "normal", 1024, 16384, 512, "causal", 530, starts="requests"))
    r.append(Recipe(s, "stride", "normal", 1024, 16384, 512, "causal", 540, row_stride=_deepgemm_stride(16384)))
    r.append(Recipe(s, "stride", "normal", 1024, 16384, 512, "causal", 541, dtype="bfloat16",
                    starts="requests", row_stride=_deepgemm_stride(16384)))
    r.append(Recipe(s, "bigk", "normal", 512, 65536, 4096, "causal", 550))
    return r


# Decode: vLLM's logits are (batch * next_n, max_model_len); sequence lengths are mixed between 1K and
# 128K tokens (log-uniform, with the extremes pinned so every batch spans them).
MAX_MODEL_LEN = 163840
SEQ_MIN, SEQ_MAX = 1024, 131072
DECODE_BATCHES = (1, 8, 32, 64, 65, 128, 256)  # 64/65: both sides of vLLM's cooperative_topk row limit
# Small scale divides max_model_len and every sequence length by this, and batches by 4 (rounded up, so
# 64 and 65 stay distinct); top_k is kept.
SMALL_DECODE_DIVISOR = 32


@dataclass(frozen=True)
class DecodeRecipe(Recipe):
    """One decode top-k call: `rows` = batch x `next_n` rows, `cols` = max_model_len; `seq_lens` is the
    rule for the requests' lengths (mixed: log-uniform in [SEQ_MIN, SEQ_MAX]; edges: lengths around
    next_n and top_k, up to the full width), each divided by `width_divisor` (small scale). With
    next_n > 1 the step is speculative and `seq_lens` has vLLM 0.33's native (batch, next_n) per-row form."""

    next_n: int = 1
    seq_lens: str = "mixed"
    width_divisor: int = 1

    @property
    def batch(self) -> int:
        return self.rows // self.next_n

    @property
    def case_id(self) -> str:
        dist = self.distribution.replace("+", "plus").replace("*", "times")
        parts = [self.group, dist, f"c{self.cols}", f"b{self.batch}", f"n{self.next_n}", f"k{self.top_k}"]
        if self.dtype != "float32":
            parts.append("bf16")
        if self.seq_lens != "mixed":
            parts.append(self.seq_lens)
        return "-".join(parts)

    def shrunk(self) -> DecodeRecipe:
        batch = -(-self.batch // 4)
        cols = self.cols // SMALL_DECODE_DIVISOR
        return replace(self, rows=batch * self.next_n, cols=cols, top_k=min(self.top_k, max(1, cols // 2)),
                       width_divisor=SMALL_DECODE_DIVISOR)


def _decode_recipe(suite: str, group: str, dist: str, batch: int, next_n: int, top_k: int, seed: int,
                   seq_lens: str = "mixed", width: int = MAX_MODEL_LEN) -> DecodeRecipe:
    return DecodeRecipe(suite, group, dist, batch * next_n, width, top_k, "decode", seed,
                        next_n=next_n, seq_lens=seq_lens)


def _decode() -> list[Recipe]:
    s = "decode"
    r: list[Recipe] = []
    # Every served shape: batch x next_n (1: plain decode, 2: one MTP draft) x top_k (V3.2: 2048, V4: 512).
    for i, (next_n, top_k, batch) in enumerate(itertools.product((1, 2), (2048, 512), DECODE_BATCHES)):
        r.append(_decode_recipe(s, "batch", "normal", batch, next_n, top_k, 600 + i))
    # The distribution ablation, one seed per batch: the same draws and lengths, transformed.
    for i, batch in enumerate((8, 64, 256)):
        for dist in ("normal", "normal+100", "normal*1e-8"):
            r.append(_decode_recipe(s, "dist", dist, batch, 1, 2048, 700 + i))
    for i, dist in enumerate(("relu", "ties")):
        r.append(_decode_recipe(s, "dist", dist, 64, 1, 2048, 710 + i))
    r.append(_decode_recipe(s, "edges", "normal", 64, 2, 2048, 720, seq_lens="edges"))
    r.append(_decode_recipe(s, "edges", "normal", 64, 1, 512, 721, seq_lens="edges"))
    return r


# Indexer prefill: vLLM prefills in chunks; a chunk's rows are its queries, causal at the end of the
# sequence so far. Small scale divides both by this (the q.k work falls 256-fold).
SMALL_INDEXER_DIVISOR = 16


@dataclass(frozen=True)
class IndexerRecipe(Recipe):
    """A prefill chunk scored by a DSA indexer (`datasets/indexer.py`): `rows` queries at the end of a
    `cols`-token sequence, causal (with `starts` = requests: three requests of a third of the width
    each, every one a document of its own)."""

    indexer: IndexerModel = field(default_factory=IndexerModel)

    def shrunk(self) -> IndexerRecipe:
        rows, cols = max(1, self.rows // SMALL_INDEXER_DIVISOR), max(1, self.cols // SMALL_INDEXER_DIVISOR)
        return replace(self, rows=rows, cols=cols, top_k=min(self.top_k, max(1, cols // 2)))


@dataclass(frozen=True)
class IndexerDecodeRecipe(DecodeRecipe):
    """A decode batch scored by a DSA indexer: each request is a window of one long text (its own
    positions, sinks at its start), its query the window's last token (next_n of them when speculative)."""

    indexer: IndexerModel = field(default_factory=IndexerModel)


# Capacities the flooded rows sit at (count, count + 1): vLLM's persistent_topk holds 16384 keys of its
# threshold bin, DeepSelect's candidate buffer at k 2048 holds k + slack + round, split's workspace slot
# lists SPLIT_SLOT_LISTED keys of a split row's coarse bucket.
PERSISTENT_TOPK_CAPACITY = 16384
# One fp16 11-bit bin and one split bin, [1, 1 + 2^-5): its top end stays below the fp16 rounding midpoint.
FLOOD_LOW, FLOOD_HIGH = np.float32(1), np.float32(1 + 31 * 2**-10)


@dataclass(frozen=True)
class FloodRecipe(DecodeRecipe):
    """A decode batch whose rows each hold `flood` values in one coarse histogram bin, [1, 1 + 2^-5) (the
    same bin of native's fp16 pass and of split's magnitude round), above every other value (all <= 0):
    the threshold bin holds them all. Small scale divides `flood` and top_k by 8 (keeping the +1)."""

    flood: int = 0

    @property
    def case_id(self) -> str:
        return f"{super().case_id}-f{self.flood}"

    def shrunk(self) -> FloodRecipe:
        base = super().shrunk()
        return replace(self, rows=base.rows, cols=base.cols, width_divisor=base.width_divisor, top_k=self.top_k // 8,
                       flood=self.flood // 8 + self.flood % 8)


def _indexer() -> list[Recipe]:
    s, v32 = "indexer", IndexerModel.of("deepseek-v3.2")
    r: list[Recipe] = []
    for i, (cols, rows) in enumerate(((8192, 2048), (32768, 2048), (65536, 1024), (131072, 512))):
        r.append(IndexerRecipe(s, "v32", "indexer", rows, cols, 2048, "causal", 800 + i, indexer=v32))
    variants = (("glm5", IndexerModel.of("glm-5")), ("v32plain", v32.plain),
                ("v32repeat", replace(v32, repeat=0.8)), ("v32sinks", replace(v32, sinks=4, sink=6.0)),
                ("v32nofp8", replace(v32, fp8=False)))
    for i, (group, m) in enumerate(variants):
        r.append(IndexerRecipe(s, group, "indexer", 2048, 32768, 2048, "causal", 810 + i, indexer=m))
    return r


def _indexer_decode_recipe(group: str, m: IndexerModel, batch: int, next_n: int, seed: int,
                           seq_lens: str = "long", suite: str = "indexer-decode", width: int = MAX_MODEL_LEN,
                           top_k: int = 2048) -> IndexerDecodeRecipe:
    return IndexerDecodeRecipe(suite, group, "indexer", batch * next_n, width, top_k, "decode",
                               seed, next_n=next_n, seq_lens=seq_lens, indexer=m)


def _indexer_decode() -> list[Recipe]:
    v32 = IndexerModel.of("deepseek-v3.2")
    r: list[Recipe] = [_indexer_decode_recipe("v32", v32, b, 1, 900 + i)
                       for i, b in enumerate((1, 8, 32, 64, 65, 128, 256, 512))]
    r += [_indexer_decode_recipe("v32", v32, b, 2, 920 + i) for i, b in enumerate((64, 128))]
    r += [_indexer_decode_recipe("glm5", IndexerModel.of("glm-5"), b, 1, 930 + i) for i, b in enumerate((128, 256))]
    r.append(_indexer_decode_recipe("v32plain", v32.plain, 256, 1, 940))
    r.append(_indexer_decode_recipe("v32", v32, 256, 1, 950, seq_lens="32k"))
    r.append(_indexer_decode_recipe("v32repeat", replace(v32, repeat=0.8), 256, 1, 960))
    return r


def _flood(suite: str = "stress", width: int = MAX_MODEL_LEN, seed: int = 560,
           beyond: tuple[int, ...] = ()) -> list[Recipe]:
    """Flooded rows of `width` columns at every capacity and one past it, and at the counts `beyond`
    (far past every capacity, which only long rows can hold)."""
    ds = deepselect_config(2048, width).cap
    cap = PERSISTENT_TOPK_CAPACITY
    shapes = [(256, n) for n in (cap, cap + 1, 40000, *beyond)]
    shapes += [(33, n) for n in (cap, cap + 1, ds, ds + 1, SPLIT_SLOT_LISTED, SPLIT_SLOT_LISTED + 1)]
    return [FloodRecipe(suite, "bin", "flood", rows, width, 2048, "decode", seed + i, seq_lens="full",
                        flood=n) for i, (rows, n) in enumerate(shapes)]


# The long-context suites: prefill chunks and decode batches 256K-1M columns wide, where DSA is used.
LONG_WIDTH = 1 << 20
# Long prefill chunks hold rows x cols = 2^27 cells (512 MiB of fp32): (cols, rows, starts).
LONG_CHUNKS = ((262144, 512, "zero"), (524288, 256, "zero"), (LONG_WIDTH, 128, "zero"), (LONG_WIDTH, 128, "requests"))
# Long decode batches (batch, next_n, top_k; at most 256 rows): plain and MTP decode at V3.2's k, and V4's
# k 512 and DeepSelect's wide k 1024 on one batch each.
LONG_BATCHES = (*((b, 1, 2048) for b in (1, 8, 64, 256)), (32, 2, 2048), (128, 2, 2048), (64, 1, 512), (64, 1, 1024))
# Flooded rows far past every capacity: one value in eight of every row in the threshold bin.
LONG_FLOOD = LONG_WIDTH // 8


def _long() -> list[Recipe]:
    """Prefill chunks of `LONG_CHUNKS` scored by V3.2's indexer, each with a normal twin (same shape and seed)."""
    s, v32 = "long", IndexerModel.of("deepseek-v3.2")
    r: list[Recipe] = [IndexerRecipe(s, "v32", "indexer", rows, cols, 2048, "causal", 1000 + i, starts=starts,
                                     indexer=v32) for i, (cols, rows, starts) in enumerate(LONG_CHUNKS)]
    return r + [Recipe(s, "ctl", "normal", x.rows, x.cols, x.top_k, x.ends, x.seed, starts=x.starts) for x in r]


def _long_decode() -> list[Recipe]:
    """Decode batches of `LONG_BATCHES` scored by V3.2's indexer, lengths 1K to the width, each with a
    normal twin of the same seed (the same rows); edge rows (lengths 0, 1, next_n, around k, 128K, the
    width) with normal values; then the flooded rows of `stress` at this width, and `LONG_FLOOD`."""
    s, w, v32 = "long-decode", LONG_WIDTH, IndexerModel.of("deepseek-v3.2")
    r: list[Recipe] = [_indexer_decode_recipe("v32", v32, b, n, 1100 + i, "long", s, w, k)
                       for i, (b, n, k) in enumerate(LONG_BATCHES)]
    r += [_decode_recipe(s, "ctl", "normal", x.batch, x.next_n, x.top_k, x.seed, x.seq_lens, w)
          for x in r if isinstance(x, DecodeRecipe)]
    r += [_decode_recipe(s, "edges", "normal", 64, n, k, 1120 + i, "edges", w)
          for i, (n, k) in enumerate(((2, 2048), (2, 1024), (1, 512)))]
    return r + _flood(s, w, 1150, (LONG_FLOOD,))


SUITES: dict[str, list[Recipe]] = {
    "seed-controls": _seed_controls(),
    # The same draws rounded to bfloat16: the published bf16 column (kernels read half the bytes).
    "seed-controls-bf16": [replace(r, suite="seed-controls-bf16", dtype="bfloat16") for r in _seed_controls()],
    "stress": _stress() + _flood(),
    "decode": _decode(),
    # The same draws rounded to bfloat16: decode logits as DeepGEMM writes them on SM100, which
    # deep_select reads without the fp32 upcast ("keeping bf16 halves top-k reads").
    "decode-bf16": [replace(r, suite="decode-bf16", dtype="bfloat16") for r in _decode()],
    "indexer": _indexer(),
    "indexer-decode": _indexer_decode(),
    "long": _long(),
    "long-decode": _long_decode(),
}


def recipes(name: str, scale: str) -> list[Recipe]:
    if name not in SUITES:
        raise ValueError(f"unknown suite {name!r}; known: {', '.join(SUITES)}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; known: {', '.join(SCALES)}")
    full = SUITES[name]
    return full if scale == "full" else [x.shrunk() for x in full]


def suite(name: str, scale: str = "small") -> Iterator[Case]:
    """Generate the suite's cases lazily, one at a time (full scale holds gigabytes in total)."""
    for recipe in recipes(name, scale):
        yield generate(recipe)


def bounds(recipe: Recipe) -> tuple[np.ndarray, np.ndarray]:
    """Per-row [start, end) for a recipe's bound rules."""
    if isinstance(recipe, DecodeRecipe):
        return np.zeros(recipe.rows, dtype=np.int32), decode_facts(recipe).row_ends()
    rows, cols, k = recipe.rows, recipe.cols, recipe.top_k
    i = np.arange(rows, dtype=np.int64)
    if recipe.ends == "causal":
        if rows > cols:
            raise ValueError(f"{recipe.case_id}: causal ends need rows <= cols")
        ends = cols - rows + i + 1
    elif recipe.ends == "diagonal":
        ends = np.minimum(i + 1, cols)
    elif recipe.ends == "ramp":
        ends = np.maximum(1, (i + 1) * cols // rows)
    elif recipe.ends == "edges":
        # Row lengths around top_k, cycled, plus full rows: the lengths where -1 tails start and stop.
        pattern = np.array([0, 1, k - 1, k, k + 1, cols], dtype=np.int64).clip(0, cols)
        ends = pattern[i % pattern.shape[0]]
    else:
        raise ValueError(f"{recipe.case_id}: unknown ends rule {recipe.ends!r}")
    starts = np.zeros(rows, dtype=np.int64)
    if recipe.starts == "requests":
        # A chunk holding three requests, each with its own KV column range and causal rows within it:
        # every request but the first starts at a non-zero column.
        if recipe.ends != "causal":
            raise ValueError(f"{recipe.case_id}: multi-request chunks are causal")
        width = cols // 3
        req = np.minimum(i * 3 // rows, 2)
        req_rows = np.bincount(req, minlength=3)
        first_row = np.concatenate([[0], np.cumsum(req_rows)[:-1]])
        starts = req * width
        ends = starts + np.clip(width - req_rows[req] + (i - first_row[req]) + 1, 0, width)
    elif recipe.starts != "zero":
        raise ValueError(f"{recipe.case_id}: unknown starts rule {recipe.starts!r}")
    return starts.astype(np.int32), ends.astype(np.int32)


def decode_facts(recipe: DecodeRecipe) -> DecodeFacts:
    """The decode call a recipe describes: its requests' lengths (drawn from their own stream, so the
    distribution ablation shares them) and the facts vLLM would pass."""
    batch, n, div = recipe.batch, recipe.next_n, recipe.width_divisor
    if recipe.seq_lens in ("mixed", "long"):
        # Log-uniform in [SEQ_MIN, top], both ends pinned; long: up to the whole (full-scale) width.
        top = SEQ_MAX if recipe.seq_lens == "mixed" else recipe.cols * div
        u = np.random.default_rng([recipe.seed, 1]).random(batch)
        lens = np.exp(np.log(SEQ_MIN) + u * (np.log(top) - np.log(SEQ_MIN))).astype(np.int64)
        lens[0] = top
        lens[1:2] = SEQ_MIN
        lens //= div
    elif recipe.seq_lens == "edges":
        # Around next_n (rows clamped at 0), around top_k (where -1 tails start and stop), and full rows.
        k = recipe.top_k
        pattern = np.array([0, 1, n, k - 1, k, k + 1, k + n, SEQ_MAX // div, recipe.cols], dtype=np.int64)
        lens = pattern[np.arange(batch) % pattern.shape[0]].clip(0, recipe.cols)
    elif recipe.seq_lens == "32k":
        lens = np.full(batch, 32768 // div, dtype=np.int64)
    elif recipe.seq_lens == "full":
        lens = np.full(batch, recipe.cols, dtype=np.int64)
    else:
        raise ValueError(f"{recipe.case_id}: unknown seq_lens rule {recipe.seq_lens!r}")
    ends = np.maximum(lens[:, None] - n + 1 + np.arange(n)[None, :], 0)
    return DecodeFacts.from_row_ends(ends, next_n=n, per_row=n > 1, max_model_len=recipe.cols,
                                     speculative=n > 1)


def _distribution(name: str, rng: np.random.Generator, n: int) -> np.ndarray:
    if name == "low10":
        # Fixed sign and exponent and the 13 high mantissa bits; only the 10 low bits vary: every value
        # lies in [1, 1 + 2^-13), one fp16 bin, the worst case for histogram passes on high bits.
        bits = np.uint32(0x3F800000) | rng.integers(0, 1 << 10, size=n, dtype=np.uint32)
        return bits.view(np.float32)
    x = rng.standard_normal(n, dtype=np.float32)
    if name == "normal":
        return x
    if name == "normal+100":
        return x + np.float32(100)
    if name == "normal*1e-8":
        return x * np.float32(1e-8)
    if name == "relu":
        return np.maximum(x - np.float32(1.28), np.float32(0))  # ~90% exact zeros
    if name == "ties":
        return np.round(x * np.float32(4)) / np.float32(4)  # a grid of 0.25: heavy exact ties
    raise ValueError(f"unknown distribution {name!r}")


def indexer_values(recipe: IndexerRecipe | IndexerDecodeRecipe, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The ragged float32 scores of an indexer recipe's rows: a prefill chunk's rows over one text with a
    document at each of their starts, or a decode batch's requests as windows of one text."""
    ix = Indexer(recipe.indexer, recipe.seed)
    rng = np.random.default_rng([recipe.seed, 5])
    if not isinstance(recipe, IndexerDecodeRecipe):
        return ix.ragged(recipe.cols, starts, ends, rng)
    # Requests are windows of one text as long as the width, each at its own offset.
    per = ends.astype(np.int64).reshape(-1, recipe.next_n)
    length = per.max(1)
    offsets = (np.random.default_rng([recipe.seed, 7]).random(length.shape[0])
               * (recipe.cols - length + 1)).astype(np.int64)
    text = ix.text(recipe.cols, offsets)
    out: list[np.ndarray] = []
    for o, n, row_ends in zip(offsets.tolist(), length.tolist(), per, strict=True):
        if n:
            out += ix.rows(text, o, o + np.maximum(row_ends, 1) - 1, row_ends, rng)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


def flood_values(recipe: FloodRecipe, lengths: np.ndarray) -> np.ndarray:
    """The ragged rows of a flooded recipe: -|normal| everywhere but `flood` random cells per row, which
    hold values drawn uniformly in [FLOOD_LOW, FLOOD_HIGH]."""
    rng = np.random.default_rng(recipe.seed)
    rows = []
    for n in lengths.tolist():
        row = -np.abs(rng.standard_normal(n, dtype=np.float32))
        if n:
            at = rng.choice(n, min(recipe.flood, n), replace=False)
            row[at] = FLOOD_LOW + rng.random(at.shape[0], dtype=np.float32) * (FLOOD_HIGH - FLOOD_LOW)
        rows.append(row)
    return np.concatenate(rows) if rows else np.zeros(0, dtype=np.float32)


def generate(recipe: Recipe) -> Case:
    """Regenerate one case from its recipe (bit-identical on every machine)."""
    starts, ends = bounds(recipe)
    total = int((ends.astype(np.int64) - starts).sum())
    if isinstance(recipe, IndexerRecipe | IndexerDecodeRecipe):
        values = indexer_values(recipe, starts, ends)
    elif isinstance(recipe, FloodRecipe):
        values = flood_values(recipe, ends.astype(np.int64) - starts)
    else:
        values = _distribution(recipe.distribution, np.random.default_rng(recipe.seed), total)
    tvalues = torch.from_numpy(values)
    if recipe.dtype == "bfloat16":
        tvalues = tvalues.to(torch.bfloat16)
    attrs: dict[str, object] = {"source": "synthetic", "distribution": recipe.distribution, "recipe": asdict(recipe)}
    if isinstance(recipe, DecodeRecipe):
        attrs.update(kind="decode", decode=decode_facts(recipe).to_json())
    return Case.from_rows(recipe.case_id, tvalues, starts, ends, top_k=recipe.top_k, cols=recipe.cols,
                          row_stride=recipe.row_stride, attrs=attrs)
