"""Indexer logits made the way a DSA indexer makes them, from synthetic queries and keys.

Random matrices miss what decides a selector's speed on real scores: their shape. A DeepSeek Sparse
Attention indexer scores key t for query i as

    score[i, t] = k_scale[t] * sum_h w[i, h] * q_scale[i, h] * relu(q8[i, h] . k8[t]) * H^-0.5 * D^-0.5

with H query heads of D dims against one key head (MQA), q and k rotated by a Hadamard matrix and
rounded to FP8 e4m3 per block of 128 values with a power-of-two scale (DeepSeek V3.2's `act_quant`
with `scale_fmt = ue8m0`: scale = 2^ceil(log2(amax / 448))), and per-head weights `w` from a bf16
projection of the token (some negative). `IndexerModel` holds the head counts and dims of the real
models (V3.2: 64 x 128, GLM-5: 32 x 128, both with a 64-dim RoPE part) and the structure trained
models show and random weights do not, each a recorded parameter:

- sink tokens: the first `sinks` keys of a sequence share a direction every head's query leans on;
- recency: RoPE's dims carry the same vector in q and k, so q . k holds sum_j cos(theta_j (i - t)),
  largest near the query and falling with distance (`recency` is its share);
- repeated text: the text is tokens of a `vocab`-sized table with spans (`span` tokens) copied from
  earlier in it (a `repeat` share of spans); a query's content matches keys of its own token, so a
  query in a copied span scores a run of keys in the span it copies.

Exactness: q8 and k8 are e4m3 values times powers of two, so every q8 . k8 is exact in float64 whatever
the summation order (at most 2^43 units of 2^-18), and the weighted sum over heads is taken in a fixed
order, elementwise; a case is the same bytes on every machine (the only other float work, building the
vectors before rounding them to bf16 and FP8, would need a value within 2^-40 of a rounding boundary to
differ).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

FP8_MAX = 448.0
QUANT_BLOCK = 128  # act_quant's block: one scale per 128 values (one per head and token at D = 128)
ROPE_THETA = 10000.0
_COL_CHUNK = 16384  # key columns per matmul block (bounds the float64 scratch at heads x chunk x 8 bytes)


def device() -> torch.device:
    """Where the q.k products run: a GPU when torch sees one (a full-scale suite is teraflops of float64
    work), else the CPU; the products are exact and the sums fixed-order, so both give the same bytes."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")

# The indexers of the models logitreplay captures: (query heads, head dim, RoPE dims).
MODELS: dict[str, tuple[int, int, int]] = {
    "deepseek-v3.2": (64, 128, 64),  # DeepSeek-V3.2 config: index_n_heads 64, index_head_dim 128
    "glm-5": (32, 128, 64),          # GLM-5 (GlmMoeDsa) config: index_n_heads 32, index_head_dim 128
}


@dataclass(frozen=True)
class IndexerModel:
    """How one case's indexer scores are made (see the module docstring); recorded in the case's recipe."""

    model: str = "deepseek-v3.2"
    heads: int = 64
    head_dim: int = 128
    rope_dim: int = 64
    fp8: bool = True      # q and k rounded to e4m3 with ue8m0 per-block scales (False: bf16 only)
    sinks: int = 1        # leading keys of a sequence every query scores high
    sink: float = 4.0     # their pull: the sink direction's weight in those keys and in every query
    recency: float = 0.2  # RoPE's share of q and k: how much scores fall with distance
    repeat: float = 0.3   # share of the text's spans copied from earlier in it
    span: int = 256       # tokens per span
    vocab: int = 8192     # token table size (a query's own token recurs only where text repeats)

    @classmethod
    def of(cls, model: str, **structure: float | int | bool) -> IndexerModel:
        heads, dim, rope = MODELS[model]
        return cls(model, heads, dim, rope, **structure)  # type: ignore[arg-type]

    @property
    def plain(self) -> IndexerModel:
        """The same indexer with random weights' scores: no sink, no recency, no repeated text."""
        return IndexerModel(self.model, self.heads, self.head_dim, self.rope_dim, self.fp8, 0, 0.0, 0.0, 0.0,
                            self.span, self.vocab)


def fp8_blocks(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """V3.2's act_quant with ue8m0 scales over the last dim (blocks of 128): the values rounded to e4m3
    (as float64, exact) and the per-block power-of-two scales (float32); x * 1 ~= values * scale."""
    shape = x.shape
    blocks = x.reshape(*shape[:-1], shape[-1] // QUANT_BLOCK, QUANT_BLOCK).float()
    amax = blocks.abs().amax(-1).clamp(min=1e-4)
    mant, exp = torch.frexp(amax / FP8_MAX)
    exp = torch.where(mant == 0.5, exp - 1, exp)  # an exact power of two keeps its exponent
    scale = torch.ldexp(torch.ones_like(amax), exp)
    q = (blocks / scale.unsqueeze(-1)).to(torch.float8_e4m3fn).to(torch.float64)
    return q.reshape(shape), scale


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix of order n (a power of two): V3.2's rotate_activation."""
    h = torch.ones((1, 1), dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / np.sqrt(n)


@dataclass
class Text:
    """One sequence's keys as the indexer's cache holds them: tokens, e4m3 keys (float64) and scales."""

    tokens: np.ndarray
    keys: torch.Tensor      # (length, head_dim) float64, e4m3 values
    key_scale: torch.Tensor  # (length,) float32 (one block per key at head_dim 128)


class Indexer:
    """A model's indexer with seeded weights: `text` builds a sequence's keys, `scores` a row's scores."""

    def __init__(self, m: IndexerModel, seed: int) -> None:
        if m.head_dim != QUANT_BLOCK:
            raise ValueError(f"indexer head_dim {m.head_dim}: the FP8 blocks need {QUANT_BLOCK}")
        self.m, self.seed = m, seed
        content = m.head_dim - m.rope_dim
        rng = np.random.default_rng([seed, 3])
        self.embed = torch.from_numpy(rng.standard_normal((m.vocab, content)) / np.sqrt(content))
        sink = rng.standard_normal(content)
        self.sink_dir = torch.from_numpy(sink / np.linalg.norm(sink))
        # Per head: how much its query follows its token, leans on the sink and on recency, its noise
        # and the mean of its weight (heads with a negative mean subtract).
        self.follow = torch.from_numpy(rng.uniform(0.5, 1.5, m.heads))
        self.lean = torch.from_numpy(rng.uniform(0.0, 1.0, m.heads))
        self.near = torch.from_numpy(rng.uniform(0.5, 1.5, m.heads))
        self.noise = torch.from_numpy(rng.uniform(0.5, 1.0, m.heads))
        self.weight_mean = rng.normal(0.5, 0.3, m.heads)
        half = m.rope_dim // 2
        self.theta = torch.from_numpy(ROPE_THETA ** (-np.arange(half) * 2.0 / m.rope_dim))
        self.rotate = hadamard(m.head_dim)

    def _rope(self, positions: torch.Tensor) -> torch.Tensor:
        """(n, rope_dim): the rotated constant vector [1, 0] of every RoPE pair at these positions,
        scaled so that its norm is 1 (q . k over these dims: mean_j cos(theta_j (i - t)))."""
        angle = positions.to(torch.float64).unsqueeze(1) * self.theta.unsqueeze(0)
        return torch.cat([angle.cos(), angle.sin()], 1) / np.sqrt(self.theta.shape[0])

    def _round(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate, round to bf16 (the activations' dtype), then to e4m3 blocks (or keep bf16)."""
        x = (x @ self.rotate).to(torch.bfloat16)
        if self.m.fp8:
            return fp8_blocks(x)
        return x.to(torch.float64), torch.ones(x.shape[:-1] + (x.shape[-1] // QUANT_BLOCK,))

    def text(self, length: int, starts: np.ndarray, stream: int = 0) -> Text:
        """A sequence of `length` tokens with copied spans, and its keys: the `sinks` keys from each of
        `starts` are sinks (a document's first tokens; a window of the text that begins at a start is a
        request of its own, and later starts inside it are the boundaries of packed documents)."""
        m = self.m
        rng = np.random.default_rng([self.seed, 4, stream])
        tokens = rng.integers(0, m.vocab, size=length)
        for b in range(1, length // m.span):
            if rng.random() < m.repeat:
                src = int(rng.integers(0, (b - 1) * m.span + 1))
                tokens[b * m.span:(b + 1) * m.span] = tokens[src:src + m.span]
        noise = torch.from_numpy(rng.standard_normal((length, m.head_dim - m.rope_dim)) * 0.5)
        content = self.embed[torch.from_numpy(tokens)] + noise
        at = (np.asarray(starts, dtype=np.int64)[:, None] + np.arange(m.sinks)[None, :]).reshape(-1)
        content[torch.from_numpy(np.unique(at[at < length]))] += m.sink * self.sink_dir
        rope = self._rope(torch.arange(length)) * np.sqrt(m.recency * m.head_dim)
        keys, scale = self._round(torch.cat([rope, content * np.sqrt(1 - m.recency)], 1))
        return Text(tokens, keys.to(device()), scale.reshape(length).to(device()))

    def queries(self, text: Text, positions: np.ndarray, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """For queries at `positions` of `text`: their e4m3 heads (n, heads, head_dim) and the fp32 weight
        of each head with its q scale and the softmax and head-count factors folded in (n, heads)."""
        m, n = self.m, positions.shape[0]
        own = self.embed[torch.from_numpy(text.tokens[positions])]
        noise = torch.from_numpy(rng.standard_normal((n, m.heads, m.head_dim - m.rope_dim)))
        content = (self.follow[None, :, None] * own[:, None, :] + self.noise[None, :, None] * noise
                   + (m.sink * self.lean)[None, :, None] * self.sink_dir)
        rope = self._rope(torch.from_numpy(positions))[:, None, :] * (self.near[None, :, None]
                                                                       * np.sqrt(m.recency * m.head_dim))
        q, q_scale = self._round(torch.cat([rope, content * np.sqrt(1 - m.recency)], 2))
        w = torch.from_numpy(rng.normal(self.weight_mean, 0.25, (n, m.heads))).to(torch.bfloat16).float()
        return q, w * q_scale.reshape(n, m.heads) * float(np.float32((m.heads * m.head_dim) ** -0.5))

    def rows(self, text: Text, lo: int, positions: np.ndarray, lengths: np.ndarray,
             rng: np.random.Generator) -> list[np.ndarray]:
        """The float32 scores of queries at `positions` of `text` over its keys from `lo`, each row cut to
        its length (a chunk's or a request's rows, which share their first key)."""
        q, w = self.queries(text, positions, rng)
        sc = self.scores(q, w, text, lo, lo + int(lengths.max(initial=0))).numpy()
        return [sc[r, :n] for r, n in enumerate(lengths.tolist())]

    def ragged(self, cols: int, starts: np.ndarray, ends: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The ragged float32 scores of rows [starts, ends) of one `cols`-token text whose documents begin
        at the rows' starts (sinks there), each row's query the last key of its range: consecutive rows
        that share a start (a chunk's, a request's) are scored together, at most 16 at a time."""
        starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        text = self.text(cols, np.unique(starts))
        out: list[np.ndarray] = []
        first = 0
        for r in range(1, starts.shape[0] + 1):
            if r == starts.shape[0] or starts[r] != starts[first] or r - first == 16:
                lo, e = int(starts[first]), ends[first:r]
                out += self.rows(text, lo, np.minimum(np.maximum(e, lo + 1), cols) - 1, e - lo, rng)
                first = r
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def scores(self, q: torch.Tensor, w: torch.Tensor, text: Text, lo: int, hi: int) -> torch.Tensor:
        """float32 (n, hi - lo): the scores of n queries over keys [lo, hi) of `text`."""
        n = q.shape[0]
        dev = text.keys.device
        out = torch.zeros((n, hi - lo), dtype=torch.float32, device=dev)
        flat = q.reshape(n * self.m.heads, self.m.head_dim).to(dev)
        w = w.to(dev)
        for c0 in range(lo, hi, _COL_CHUNK):
            c1 = min(hi, c0 + _COL_CHUNK)
            dots = (flat @ text.keys[c0:c1].T).reshape(n, self.m.heads, c1 - c0).clamp_(min=0).float()
            acc = out[:, c0 - lo:c1 - lo]
            for h in range(self.m.heads):  # a fixed order: the same float32 sums everywhere
                acc += dots[:, h] * w[:, h:h + 1]
            acc *= text.key_scale[c0:c1]
        return out.cpu()


__all__ = ["MODELS", "Indexer", "IndexerModel", "Text", "fp8_blocks", "hadamard"]
