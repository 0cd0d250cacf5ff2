"""The results of a replay and their JSON: one shape, stated by the types here and checked against
`report.schema.json` on every write.

The dataclasses are the shape; `encode` and `decode` turn any of them into JSON and back from their
fields (`Timing` adds its derived statistics), so no class restates its fields by hand. The schema is the published contract for other tools; `write_json` validates every
report against it before a byte is written, and a test holds the schema's properties equal to the
fields, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from logitreplay.errors import LogitreplayError, one_line
from logitreplay.replay.determinism import Determinism
from logitreplay.replay.protocol import Timing, TimingProtocol
from logitreplay.replay.recall import Damage
from logitreplay.replay.ties import Agreement, Ties
from logitreplay.replay.verify import Failure

T = TypeVar("T")


@dataclass
class SelectorResult:
    """What happened to one selector on one case.

    `status`: "ok" (verified, and `timing` holds its samples), "approximate" (verified and timed under
    `replay --tolerate-recall`: its values are not the exact top-k's, but every row's recall reaches the
    tolerance; never called exact), "unsupported" (`reason` is what `supports` said), "failed" (a
    verification check failed: `failures`, first check first; `reason` names it) or "error" (`supports`,
    `prepare`, the launch or the timing raised: `reason` is the exception in one line).

    `damage`: how far its selected values are from the exact top-k's (recall.py), wherever they differ
    (check 3 failed, or an approximate selector); None where they are exact or were never compared.
    `determinism`: what `replay --determinism N`'s reruns showed (determinism.py); None without it.
    `tie_policy`: how it chose among the candidates tied at the k-th value (ties.py: lowest, highest,
    none observed), None where it was not timed or no row offered a choice."""

    selector: str
    status: str
    reason: str | None = None
    failures: list[Failure] = field(default_factory=list)
    timing: Timing | None = None
    damage: Damage | None = None
    determinism: Determinism | None = None
    tie_policy: str | None = None
    # Its index sets, one digest per row (ties.py), for the agreement of selectors that ran in other
    # processes; not part of the report (`merge` drops it once the case's agreement is found).
    row_digests: Any = field(default=None, repr=False, compare=False, metadata={"report": False})


@dataclass
class CaseResult:
    """One case of a replay: its shape and source, and one `SelectorResult` per selector (in the order
    asked for; empty when the case is invalid).

    `source` is a short description for tables (synthetic distribution, or model and layer);
    `valid_bytes` the in-bounds logits bytes (the least any selector must read); `invalid` why the case
    could not be replayed (NaN inside a row), else None; `floor_us` the read floor (valid bytes / measured
    read bandwidth) when the device's bandwidth was measured; `fast_path` whether vLLM's DeepSelect
    prefill fast path would take this case, with `fast_path_note` saying why not. `ties`: the candidates
    tied at its rows' k-th values, and `agreement`: per pair of timed selectors, the fraction of rows
    whose index sets agree (ties.py); None and empty when no selector was timed."""

    case_id: str
    rows: int
    cols: int
    top_k: int
    dtype: str
    row_stride: int
    source: str
    valid_bytes: int
    invalid: str | None = None
    floor_us: float | None = None
    fast_path: bool = False
    fast_path_note: str = ""
    results: list[SelectorResult] = field(default_factory=list)
    kind: str = "prefill"  # "prefill" or "decode" (`Case.kind`)
    ties: Ties | None = None
    agreement: list[Agreement] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return encode(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CaseResult:
        return decode(cls, d)

    def result(self, selector: str) -> SelectorResult | None:
        return next((r for r in self.results if r.selector == selector), None)

    def timed(self, selector: str) -> Timing | None:
        """The selector's timing on this case; None when it was not verified and timed."""
        res = self.result(selector)
        return None if res is None else res.timing


@dataclass
class ReplayResult:
    """A whole replay: the `device` ("cpu", "cuda:0"), what the times are (`clock_label`), the timing
    `protocol`, the `environment` (versions, CPU, GPU), the `baseline` selector ratios are taken against,
    the `selectors` in column order, the `cases`, and `notes` (e.g. CPU protocol reductions)."""

    device: str
    clock_label: str
    protocol: TimingProtocol
    environment: dict[str, Any]
    baseline: str | None
    selectors: list[str]
    cases: list[CaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    recommendation: list[dict[str, Any]] = field(default_factory=list)  # `replay --recommend` (recommend.py)
    per_forward: list[dict[str, Any]] = field(default_factory=list)  # `replay --per-forward` (per_forward.py)
    ranks: list[dict[str, Any]] = field(default_factory=list)  # a replay over ranks, or a merge (distributed.py)
    # An interrupted run (SIGINT, SIGTERM): the signal, cases done of the run's total, the run's
    # configuration and outputs, so that `replay --resume` replays the rest (resume.py). None: complete.
    partial: dict[str, Any] | None = None

    SCHEMA: ClassVar[str] = "logitreplay.replay/1"

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.SCHEMA, **encode(self)}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReplayResult:
        if d.get("schema") != cls.SCHEMA:
            raise ValueError(f"not a replay result (schema {d.get('schema')!r}, expected {cls.SCHEMA!r})")
        return decode(cls, {k: v for k, v in d.items() if k != "schema"})


def encode(obj: Any) -> Any:
    """JSON of a result object: a dataclass by its fields, a `Timing` with its derived statistics."""
    if isinstance(obj, Timing):
        return obj.to_json()  # with its statistics, for readers of the file
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in report_fields(obj)}
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    return obj


def report_fields(cls: Any) -> list[dataclasses.Field[Any]]:
    """The fields of a result type (or object) that its JSON holds: all but those marked `report: False`."""
    return [f for f in dataclasses.fields(cls) if f.metadata.get("report", True)]


def decode(cls: type[T], data: Any) -> T:
    """The inverse of `encode` for `cls`, led by its field types (a nested result, a list of them, or
    a plain JSON value)."""
    kwargs = {name: data[name] if how is None else how(data[name]) for name, how in _decoders(cls) if name in data}
    return cls(**kwargs)


Decoder = Callable[[Any], Any] | None  # None: the JSON value is the field's value
_DECODERS: dict[type, tuple[tuple[str, Decoder], ...]] = {}


def _decoders(cls: type) -> tuple[tuple[str, Decoder], ...]:
    """The reported fields of a result type, each with its decoder, made once per type: resolving the
    annotations for every object was most of the cost of reading a large report (thousands of results)."""
    if cls not in _DECODERS:
        hints = typing.get_type_hints(cls)
        _DECODERS[cls] = tuple((f.name, _decoder(hints[f.name])) for f in report_fields(cls))
    return _DECODERS[cls]


def _decoder(tp: Any) -> Decoder:
    """How a JSON value of type `tp` becomes the field's: a nested result, a `Timing`, a list (a new one,
    of decoded items), any of them or None (`X | None`); None where it is the plain value itself."""
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType)
    if optional:
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    how: Decoder = None
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        each = _decoder(item)
        how = list if each is None else functools.partial(_each, each)
    elif tp is Timing:
        how = Timing.from_json
    elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
        how = functools.partial(decode, tp)
    return functools.partial(_unless_none, how) if optional and how is not None else how


def _each(how: Callable[[Any], Any], values: list[Any]) -> list[Any]:
    return [how(v) for v in values]


def _unless_none(how: Callable[[Any], Any], value: Any) -> Any:
    return None if value is None else how(value)


class ReportError(LogitreplayError):
    """A replay report that does not match `report.schema.json` (a bug if we wrote it; bad input if read)."""


def schema() -> dict[str, Any]:
    """The JSON Schema of `ReplayResult.to_json()` (shipped with the package)."""
    return json.loads(resources.files("logitreplay.replay").joinpath("report.schema.json").read_text())


def validate(data: dict[str, Any]) -> str | None:
    """Raise `ReportError` (one line: the path and the violation) unless `data` matches the schema. A check
    that cannot run (jsonschema missing or failing) must not cost a run its report: it returns why, in one
    line, for the caller to say; None when the check passed."""
    try:
        import jsonschema

        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema()).iter_errors(data))
    except Exception as e:
        return f"the report's schema check could not run ({type(e).__name__}: {one_line(e)}); written unchecked"
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise ReportError(f"replay report does not match report.schema.json at {where}: {error.message[:200]}")
    return None


def write_json(result: ReplayResult, path: Path) -> str | None:
    """Validate the report against the schema, then write it (nothing is written when it does not match);
    returns `validate`'s line when the check could not run (the report is then written unchecked)."""
    data = result.to_json()
    unchecked = validate(data)
    path.write_text(json.dumps(data, indent=1, allow_nan=False) + "\n")
    return unchecked


def read_json(path: Path) -> ReplayResult:
    return ReplayResult.from_json(json.loads(path.read_text()))


__all__ = ["CaseResult", "ReplayResult", "ReportError", "SelectorResult", "decode", "encode", "read_json",
           "schema", "validate", "write_json"]
