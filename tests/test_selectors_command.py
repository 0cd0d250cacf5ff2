"""`logitreplay selectors`: every registered name, whether it can run here and why not, what it takes, and
the version an adapter was read from; in 80 columns, or as JSON."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from logitreplay.cli import main
from logitreplay.replay.report import WIDTH
from logitreplay.selectors import listing
from logitreplay.selectors.registry import available
from logitreplay.selectors.upstream import catalog


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["selectors", *args])
    return r.exit_code, r.output


def test_every_registered_name_is_listed_in_80_columns() -> None:
    code, out = _run()
    assert code == 0
    assert all(len(line) <= WIDTH for line in out.splitlines())
    assert f"{len(available())} selectors" in out
    firsts = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert set(available()) <= firsts  # every name whole on its own line, to copy into --selectors


def test_json_has_each_adapters_package_range_and_takes() -> None:
    code, out = _run("--json")
    assert code == 0
    rows = {r["name"]: r for r in json.loads(out)["selectors"]}
    assert set(rows) == set(available())
    ragged = rows["flashinfer-ragged"]
    assert (ragged["kind"], ragged["device"], ragged["package"], ragged["read_from"]) == \
        ("adapter", "cuda", "flashinfer-python", "0.7.2.post1")
    assert ragged["accepts"] == ">=0.7.2,<0.7.5" and ragged["k"] == "1-2048"
    assert ragged["dtypes"] == ["float32", "float16", "bfloat16"] and "starts" in ragged["layouts"]
    assert rows["vllm-persistent"]["k"] == "512 1024 2048"
    assert rows["native"]["status"] == "ok" and rows["native"]["device"] == "cpu, cuda"


def test_a_missing_package_says_what_to_install_and_a_foreign_version_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing.importlib.util, "find_spec", lambda name: None)
    row = next(r for r in listing.listing() if r.name == "sgl-fast-topk")
    assert (row.status, row.why) == ("not installed", "pip install sglang-kernel==0.4.6")
    monkeypatch.setattr(listing.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(listing, "installed_version", lambda source: "0.4.11")
    row = next(r for r in listing.listing() if r.name == "sgl-fast-topk")
    assert row.status == "refused" and row.version == "0.4.11"
    assert row.why == ("sglang-kernel 0.4.11 is not a version this adapter knows: it was read from 0.4.6 and "
                       "takes 0.4.6 <= version < 0.4.11")
    code, out = _run()
    assert code == 0 and "refused" in out and "sglang-kernel 0.4.11 is not a version" in " ".join(out.split())


def test_the_catalog_is_the_registrys_source_of_adapters() -> None:
    adapters = catalog.adapters()
    assert {n: e.factory for n, e in adapters.items()} == {n: available()[n] for n in adapters}
    assert all(e.declared.family for e in adapters.values())


def test_check_loads_each_kernel_and_says_what_it_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listing, "find", lambda source: "not installed (pip install x)"
                        if source.top == "flashinfer" else "vllm._C_stable_libtorch does not import (OSError: bad)")
    rows = {r.name: r for r in listing.listing(check=True)}
    assert (rows["flashinfer-topk"].status, rows["flashinfer-topk"].why) == \
        ("not installed", "not installed (pip install x)")
    assert rows["vllm-native"].status == "unusable" and "does not import" in rows["vllm-native"].why
