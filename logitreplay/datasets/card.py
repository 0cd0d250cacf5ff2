"""The dataset card (README.md with YAML front matter) of a published archive, built from the archive.

Everything on the card is derived from the cases' stored attributes, never typed by hand, so a card
regenerated from the same archive is identical (no timestamps) and a card can be checked against its
data. The front matter carries the Hub's standard fields and a `logitreplay` block (models with their
exact revisions, engines, capture policies, the selection contract) that tools can read back through
`DatasetCard.load(...).data`.
"""

from __future__ import annotations

import json
from typing import Any

from huggingface_hub import DatasetCard, DatasetCardData

from logitreplay.archive import ELEMENT_BYTES, SCHEMA_VERSION, Archive, CaseInfo

SELECTOR_SEMANTICS = (
    "For row r, return the indices of the top_k largest values of logits[r, row_starts[r]:row_ends[r]], "
    "relative to row_starts[r], in any order, as int32; when the row holds fewer than top_k values, return "
    "all of them and fill the remaining slots with -1. Ties at the k-th value may be broken arbitrarily, so "
    "a result is judged by the multiset of selected values (bit-exact), never by the index set."
)
TAGS = ["logitreplay", "sparse-attention", "top-k", "indexer-logits", "deepseek-sparse-attention"]


def _first(d: dict[str, Any], *keys: str) -> Any:
    return next((d[k] for k in keys if d.get(k) is not None), None)


def _distinct(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for x in items:
        if x is not None and x not in out:
            out.append(x)
    return out


def size_category(n: int) -> str:
    """The Hub's size bucket for `n` examples (a case is one example)."""
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K")):
        if n < limit:
            return name
    return "100K<n<1M"


def card_fields(infos: list[CaseInfo]) -> dict[str, Any]:
    """The `logitreplay` block of the front matter: what a reader needs to trust and reproduce the data."""
    provs = [i.provenance for i in infos]
    # Provenance keys as capture records them (capture/hf.py, capture/serving.py, capture/writer.py).
    models = _distinct([{"id": str(p["model"]), "revision": p.get("revision")} for p in provs if p.get("model")])
    engines = _distinct([{"name": str(p["engine"]), "version": p.get("engine_version")}
                         for p in provs if p.get("engine")])
    return {
        "schema_version": SCHEMA_VERSION,
        "cases": len(infos),
        "sources": _distinct([_first(p, "source", "engine") for p in provs]),
        "models": models,
        "engines": engines,
        "capture_policy": _distinct([p.get("capture_policy") for p in provs]),
        "dtypes": _distinct([i.attrs.get("dtype") for i in infos]),
        "selector_semantics": SELECTOR_SEMANTICS,
    }


def case_row(info: CaseInfo) -> dict[str, Any]:
    a, p = info.attrs, info.provenance
    return {"id": info.case_id, "layer": _first(p, "layer_name", "layer_index"),
            "rows": a.get("rows"), "cols": a.get("cols"), "top_k": a.get("top_k"), "dtype": a.get("dtype"),
            "bytes": int(a.get("valid_elements", 0)) * ELEMENT_BYTES.get(str(a.get("dtype")), 4),
            "sha256": a.get("sha256")}


def _table(rows: list[dict[str, Any]]) -> str:
    cols = ["id", "layer", "rows", "cols", "top_k", "dtype", "bytes", "sha256"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("-" if r[c] is None else f"`{r[c]}`" if c in ("id", "sha256") else str(r[c])
                                       for c in cols) + " |")
    return "\n".join(lines)


def _provenance_section(infos: list[CaseInfo], fields: dict[str, Any]) -> str:
    lines = []
    for m in fields["models"]:
        lines.append(f"- Model `{m['id']}` at revision `{m['revision'] or 'unrecorded'}`.")
    for e in fields["engines"]:
        lines.append(f"- Engine {e['name']} {e['version'] or ''}".rstrip() + ".")
    for pol in fields["capture_policy"]:
        lines.append(f"- Capture policy: `{pol if isinstance(pol, str) else json.dumps(pol, sort_keys=True)}`.")
    synthetic = [i for i in infos if i.provenance.get("source") == "synthetic"]
    suites = _distinct([i.provenance.get("recipe", {}).get("suite") for i in synthetic])
    if synthetic:
        lines.append(f"- {len(synthetic)} synthetic control case(s): each case's `provenance.recipe` attribute "
                     "regenerates it bit for bit"
                     + "".join(f"; `logitreplay synth --suite {s} --scale SCALE` writes the whole suite"
                               for s in suites) + ".")
    indexer = [i.provenance["recipe"]["indexer"] for i in synthetic if "indexer" in i.provenance.get("recipe", {})]
    if indexer:
        models = ", ".join(f"{m['model']} ({m['heads']} heads x {m['head_dim']})"
                           for m in _distinct([{k: m[k] for k in ("model", "heads", "head_dim")} for m in indexer]))
        lines.append(f"- {len(indexer)} indexer case(s): scores made as a DSA indexer makes them, per-head ReLU(q.k) "
                     f"weighted and summed over the heads of {models}, q and k rounded to FP8 e4m3 with power-of-two "
                     "scales per 128 values where `fp8` is set, with sink tokens, recency and repeated text; "
                     "`provenance.recipe.indexer` holds every parameter (they are synthetic, not captured).")
    flooded = [i.provenance["recipe"]["flood"] for i in synthetic if "flood" in i.provenance.get("recipe", {})]
    if flooded:
        lines.append(f"- {len(flooded)} flooded-bin case(s) (`provenance.recipe.flood`: "
                     f"{', '.join(str(n) for n in _distinct(flooded))}): every row holds that many values in "
                     "[1, 1 + 2^-5), one coarse histogram bin, above all its other values (<= 0).")
    decode = sum(i.provenance.get("kind") == "decode" for i in infos)
    if decode:
        lines.append(f"- {decode} decode case(s) (`provenance.kind: decode`): `provenance.decode` holds the arguments of "
                     "the decode top-k call: `batch`, `next_n`, `seq_lens` ((batch, 1), or (batch, next_n) per row), "
                     "`max_seq_len`, `max_model_len` (the logits width), the `backend` that ran, and whether the step "
                     "was `speculative`; every row starts at 0, and row r of request b ends at "
                     "max(0, seq_lens[b] - next_n + 1 + r mod next_n) (per row: seq_lens[b, r mod next_n]).")
    lines.append("- Every array carries a sha256 checksum, verified on every read; the table's `sha256` is the "
                 "checksum of the in-range values.")
    return "\n".join(lines)


def build_card(archive: Archive, repo_id: str, license: str = "cc-by-4.0") -> DatasetCard:
    """The card for `archive` published as the dataset repo `repo_id` (the repo root is the archive)."""
    infos = [i for i in archive.infos() if i.complete]
    fields = card_fields(infos)
    title = str(archive.attrs.get("title") or repo_id.split("/")[-1])
    data = DatasetCardData(license=license, pretty_name=title, tags=TAGS,
                           size_categories=[size_category(len(infos))], viewer=False, logitreplay=fields)
    url = f"hf://datasets/{repo_id}"
    if fields["sources"] == ["synthetic"] and all("indexer" in i.provenance.get("recipe", {}) for i in infos):
        what = ("Synthetic indexer logits: scores computed from synthetic queries and keys the way a sparse-attention\n"
                "indexer computes them (FP8 per-head q.k, ReLU, weighted head sum), with the sink tokens, recency and\n"
                "repeated text trained indexers show. They stand in for captured logits; they are not captured data.")
    elif fields["sources"] == ["synthetic"]:
        what = ("Synthetic control cases in the shapes of sparse-attention indexer logits: normal-random scores,\n"
                "distribution ablations and edge cases. They explain what real captured logits do to a top-k\n"
                "selector; they are not captured data.")
    else:
        what = ("Sparse-attention indexer logits captured from real model runs, each matrix exactly as the\n"
                "engine's top-k selector received it.")
    total = sum(case_row(i)["bytes"] for i in infos)
    body = f"""
# {title}

{what}

Format: this repository is a logitreplay archive (a zarr v3 group; one group per case under `cases/`, each
array a single shard). A case holds the in-range logits of each row (float32, or bfloat16 as raw bits), the row
bounds, `top_k`, the source width and row stride, and its provenance as JSON attributes.

## Replay

```bash
logitreplay replay {url}
```

This streams only the cases it reads. To keep a local copy or hand a case to a kernel author:

```bash
logitreplay pull {repo_id} --out {repo_id.split('/')[-1]}      # pinned to the current commit
logitreplay export {url} --case <id> --out cases/   # one .safetensors per case
```

## Selection contract

{SELECTOR_SEMANTICS}

## Cases

{len(infos)} cases, {total} bytes ({total / 2**30:.2f} GiB) of in-range logits.

{_table([case_row(i) for i in infos])}

## Provenance

{_provenance_section(infos, fields)}

## Citation

```bibtex
@misc{{{repo_id.replace('/', '_').replace('-', '_')},
  title        = {{{title}}},
  howpublished = {{Hugging Face dataset {repo_id}, commit <sha>}},
  note         = {{Packaged with logitreplay}}
}}
```
"""
    return DatasetCard(f"---\n{data.to_yaml()}\n---\n{body}")
