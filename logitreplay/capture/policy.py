"""Which indexer matrices a capture keeps.

A model run produces one score matrix per indexer layer per forward: far more than anyone replays, and
mostly the same shape over and over. The default keeps the *first eligible matrix per (layer, column
width)*, which covers every layer at every context length that occurred while writing each shape once.
Decode calls are keyed by *(layer, batch bucket, width bucket)* instead (`shape_key`): their rows are the
batch (x next_n), which changes from step to step, and their width is max_model_len (vLLM) or grows by one
column per token (transformers), so exact shapes would keep either one step per layer or every step.
Buckets are powers of two: 64 and 65 rows fall apart, as vLLM's decode top-k backends do (cooperative_topk
takes at most 64 rows).

Every decision on the model's thread is made from shapes and facts already on the host, never from
device data (reading the row bounds would synchronise the host with the model's stream): `wants` answers
from (layer, width) so that the capture hooks can refuse a call before doing any work, and `admit` charges
the budgets with the whole (rows, cols) matrix, an upper bound of its in-range bytes. The writer thread,
once the bounds reach the host, `settle`s the charge to the exact size, or `release`s it when the matrix
turns out ineligible (several requests under single-request-only). Decisions are counted, never raised:
the model must not notice a capture.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

from logitreplay.errors import PolicyError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _bucket(n: int) -> int:
    """The power of two at or above n (1 for n <= 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def decode_rows(kind: str | None, rows: int) -> int | None:
    """The rows a call of `kind` ("prefill", "decode") counts in its policy key: its rows for a decode
    call, None for any other."""
    return rows if kind == "decode" else None


def shape_key(layer: int, width: int, decode_rows: int | None = None) -> tuple[object, ...]:
    """What the default policy keeps one matrix of: (layer, width), or for a decode call of
    `decode_rows` rows ("decode", layer, rows bucket, width bucket)."""
    if decode_rows is None:
        return (layer, width)
    return ("decode", layer, _bucket(decode_rows), _bucket(width))


@dataclass(frozen=True)
class Policy:
    """What to capture. `layers` None means every layer; a budget of None means unlimited."""

    every_call: bool = False
    layers: frozenset[int] | None = None
    min_width: int = 0
    max_width: int | None = None
    single_request_only: bool = False
    max_cases: int | None = None
    max_bytes: int | None = None

    @classmethod
    def parse(cls, spec: str) -> Policy:
        """Parse `every,layers=0-3+7,min-width=1024,max-width=65536,single-request,max-cases=20,max-bytes=2G`.

        Items are comma-separated and all optional; an empty spec is the default policy. The same string
        configures the CLI (`--policy`) and the vLLM plugin (`LOGITREPLAY_CAPTURE_POLICY`).
        """
        opts: dict[str, Any] = {}
        for raw in spec.split(","):
            item = raw.strip()
            if not item:
                continue
            key, sep, value = (s.strip() for s in item.partition("="))
            key = key.lower().replace("_", "-")
            if key in ("every", "every-call", "first") and not sep:
                opts["every_call"] = key != "first"
            elif key == "single-request" and not sep:
                opts["single_request_only"] = True
            elif key == "layers" and sep:
                opts["layers"] = _parse_layers(value)
            elif key in ("min-width", "max-width", "max-cases") and sep:
                opts[key.replace("-", "_")] = _parse_int(key, value)
            elif key == "max-bytes" and sep:
                opts["max_bytes"] = parse_size(value)
            else:
                raise PolicyError(f"capture policy item {item!r}: unknown; expected every, first, "
                                  "single-request, layers=A-B+C, min-width=N, max-width=N, max-cases=N, "
                                  "max-bytes=SIZE")
        policy = cls(**opts)
        if policy.max_width is not None and policy.max_width < policy.min_width:
            raise PolicyError(f"capture policy: max-width={policy.max_width} < min-width={policy.min_width}")
        return policy

    def describe(self) -> dict[str, Any]:
        """JSON form, recorded in every case's provenance so a dataset says how it was sampled."""
        return {
            "mode": "every_call" if self.every_call else "first_per_layer_width",
            "decode_key": None if self.every_call else "first per layer, power-of-two rows and width buckets",
            "layers": sorted(self.layers) if self.layers is not None else None,
            "min_width": self.min_width,
            "max_width": self.max_width,
            "single_request_only": self.single_request_only,
            "max_cases": self.max_cases,
            "max_bytes": self.max_bytes,
        }


@dataclass
class PolicyState:
    """The running state of one policy in one process: what was taken and why the rest was not.

    `skipped` counts matrices the policy did not want after looking at them (e.g. a multi-request chunk
    under single-request-only); `dropped` counts matrices it wanted but could not keep (budget, full
    queue, writer failure). Matrices refused from their shape alone are not counted: there are too many.
    """

    policy: Policy
    taken: set[tuple[object, ...]] = field(default_factory=set)
    cases: int = 0
    nbytes: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def exhausted(self) -> bool:
        p = self.policy
        return ((p.max_cases is not None and self.cases >= p.max_cases)
                or (p.max_bytes is not None and self.nbytes >= p.max_bytes))

    def wants(self, layer: int, width: int, decode_rows: int | None = None) -> bool:
        """Shape-only decision, cheap enough to run on every indexer call (`decode_rows`: the rows of a
        decode call, None for prefill)."""
        p = self.policy
        if width < p.min_width or (p.max_width is not None and width > p.max_width):
            return False
        if not p.every_call and shape_key(layer, width, decode_rows) in self.taken:
            return False
        return self.wants_layer(layer)

    def wants_layer(self, layer: int) -> bool:
        """The decision when a call's width is not visible from its inputs (checked again once it is)."""
        return (self.policy.layers is None or layer in self.policy.layers) and not self.exhausted()

    def admit(self, layer: int, width: int, nbytes: int, single_request: bool) -> bool:
        """Decision from shapes (on the model's thread); counts the reason when the answer is no.

        `nbytes` is what the matrix may hold at most; `single_request` False when its shape already shows
        several requests (a batch), True when it may hold one (the writer checks the bounds)."""
        if self.policy.single_request_only and not single_request:
            self.skip("multi_request")
            return False
        if self.policy.max_bytes is not None and self.nbytes + nbytes > self.policy.max_bytes:
            self.drop("over_byte_budget")
            return False
        if self.exhausted():
            self.drop("over_case_budget")
            return False
        return True

    def record(self, layer: int, width: int, nbytes: int, decode_rows: int | None = None) -> None:
        """A matrix was handed to the writer: it now counts against the budgets and its shape is done."""
        with self._lock:
            self.taken.add(shape_key(layer, width, decode_rows))
            self.cases += 1
            self.nbytes += nbytes

    def settle(self, charged: int, nbytes: int) -> None:
        """A recorded matrix holds exactly `nbytes` in range (known on the writer thread): charge that
        instead of the upper bound it was admitted with."""
        with self._lock:
            self.nbytes += nbytes - charged

    def release(self, layer: int, width: int, charged: int, decode_rows: int | None = None) -> None:
        """Undo `record` for a matrix found ineligible once its bounds were on the host: it costs no budget,
        and its shape may be taken by a later matrix."""
        with self._lock:
            self.taken.discard(shape_key(layer, width, decode_rows))
            self.cases -= 1
            self.nbytes -= charged

    def drop(self, reason: str) -> None:
        """Count a wanted matrix that could not be kept (the model thread and the writer thread both drop)."""
        with self._lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def skip(self, reason: str) -> None:
        with self._lock:
            self.skipped[reason] = self.skipped.get(reason, 0) + 1


def parse_size(text: str) -> int:
    """`2G`, `512MiB`, `1000000` -> bytes (binary units)."""
    m = _SIZE.match(text)
    if not m:
        raise PolicyError(f"capture policy: size {text!r}: expected a number with an optional K/M/G/T unit")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _parse_int(key: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise PolicyError(f"capture policy: {key}={value!r}: expected an integer") from None
    if n < 0:
        raise PolicyError(f"capture policy: {key}={value!r}: must be >= 0")
    return n


def _parse_layers(value: str) -> frozenset[int]:
    layers: set[int] = set()
    for part in value.split("+"):
        lo, dash, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise PolicyError(f"capture policy: layers={value!r}: expected indices like 0-3+7") from None
        if b < a or a < 0:
            raise PolicyError(f"capture policy: layers={value!r}: bad range {part!r}")
        layers.update(range(a, b + 1))
    return frozenset(layers)


__all__ = ["Policy", "PolicyError", "PolicyState", "parse_size"]
