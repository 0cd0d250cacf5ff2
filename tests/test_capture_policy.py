"""Capture policy: the spec users write (CLI --policy, LOGITREPLAY_CAPTURE_POLICY) and what it selects."""

from __future__ import annotations

import pytest

from logitreplay.capture.policy import Policy, PolicyState, parse_size
from logitreplay.errors import PolicyError


def test_default_keeps_first_matrix_per_layer_and_width() -> None:
    sel = PolicyState(Policy.parse(""))
    assert sel.wants(0, 1024)
    sel.record(0, 1024, 100)
    assert not sel.wants(0, 1024)
    assert sel.wants(0, 2048) and sel.wants(1, 1024)


def test_decode_calls_are_kept_once_per_layer_batch_bucket_and_width_bucket() -> None:
    """Decode rows are the batch, which changes every step: one matrix per power-of-two bucket of rows
    (64 and 65 apart, as vLLM's cooperative_topk takes at most 64) and of width, never a prefill's key."""
    sel = PolicyState(Policy.parse(""))
    sel.record(0, 163840, 100, decode_rows=8)
    assert not sel.wants(0, 163840, decode_rows=5) and not sel.wants(0, 131073, decode_rows=8)
    assert sel.wants(0, 163840, decode_rows=9) and sel.wants(0, 131072, decode_rows=8)
    assert sel.wants(1, 163840, decode_rows=8) and sel.wants(0, 163840)  # another layer; a prefill call
    sel.record(0, 163840, 100, decode_rows=64)
    assert not sel.wants(0, 163840, decode_rows=33) and sel.wants(0, 163840, decode_rows=65)
    sel.release(0, 163840, 100, decode_rows=40)
    assert sel.wants(0, 163840, decode_rows=64)
    every = PolicyState(Policy.parse("every"))
    every.record(0, 163840, 100, decode_rows=8)
    assert every.wants(0, 163840, decode_rows=8)


def test_full_spec_round_trips_into_provenance() -> None:
    p = Policy.parse("every, layers=0-2+7, min-width=64, max-width=4096, single-request, max-cases=5, max-bytes=1.5M")
    assert p.describe() == {"mode": "every_call", "decode_key": None, "layers": [0, 1, 2, 7], "min_width": 64, "max_width": 4096,
                            "single_request_only": True, "max_cases": 5, "max_bytes": 1572864}


def test_filters_by_layer_and_width() -> None:
    sel = PolicyState(Policy.parse("every,layers=1+3,min-width=100,max-width=200"))
    assert [sel.wants(layer, 150) for layer in range(5)] == [False, True, False, True, False]
    assert not sel.wants(1, 99) and sel.wants(1, 100) and sel.wants(1, 200) and not sel.wants(1, 201)


def test_budgets_stop_and_count_drops() -> None:
    sel = PolicyState(Policy.parse("every,max-cases=2,max-bytes=1000"))
    assert sel.admit(0, 10, 400, single_request=True)
    sel.record(0, 10, 400)
    assert not sel.admit(0, 10, 700, single_request=True)  # would exceed the byte budget
    assert sel.dropped == {"over_byte_budget": 1}
    assert sel.admit(0, 10, 500, single_request=True)
    sel.record(0, 10, 500)
    assert sel.exhausted() and not sel.wants(0, 10)
    assert not sel.admit(0, 10, 1, single_request=True)
    assert sel.dropped == {"over_byte_budget": 1, "over_case_budget": 1}


def test_single_request_only_skips_multi_request_chunks() -> None:
    sel = PolicyState(Policy.parse("single-request"))
    assert not sel.admit(0, 10, 4, single_request=False)
    assert sel.skipped == {"multi_request": 1} and sel.dropped == {}
    assert sel.admit(0, 10, 4, single_request=True)


@pytest.mark.parametrize("spec, message", [
    ("evry", "unknown"),
    ("layers=a-b", "expected indices"),
    ("layers=5-2", "bad range"),
    ("min-width=-3", ">= 0"),
    ("max-cases=many", "expected an integer"),
    ("max-bytes=lots", "size"),
    ("min-width=10,max-width=5", "max-width=5 < min-width=10"),
])
def test_bad_specs_name_the_item(spec: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Policy.parse(spec)


def test_sizes_use_binary_units() -> None:
    assert parse_size("2G") == 2 << 30 and parse_size("512MiB") == 512 << 20 and parse_size("1000") == 1000
