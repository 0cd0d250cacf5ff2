"""Every built-in suite at small scale is pinned by one sha256 over its cases (ids, shapes, attributes
and every array's bytes): a change to a recipe, a distribution or the generator that alters what a
suite holds fails here, so published replays of a suite stay comparable, or the pin is renewed on
purpose with the change. A new suite adds its line to PINNED."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from logitreplay.datasets import synth

PINNED = {
    "seed-controls": "bc895b14c387b216b2d8ab17830a47e7fab9eafdf757b3d32a41cd4bcb48e1c7",
    "seed-controls-bf16": "5c99276920c4eef8f01198ef58a96118c5d0fdbbfb57889b6944eb738bc3d3a9",
    "stress": "00519860eb2157cb629f86b1d9e919a06ea328e399bde84357bc2676e6385824",
    "decode": "6104c078cb34c63c8a4bd09f71ac9d39f011dd35a2cc301a526ed58a2e3ef5be",
    "decode-bf16": "5006ac7afa12f234eeda3d94853a440607d96abefe6a79997803c1dcbcb96a13",
    # exact float64 sums of e4m3 products (datasets/indexer.py): the same bytes on any machine and thread count
    "indexer": "b6c4b23b66c0ec3b99615ddc5908668ad39c8334ae9b864257f257923aaa1a3f",
    "indexer-decode": "e3e746158c9b40710ab6830e359ada8fccfde0171aa7bae9d2ffbd78de664a2f",
    "long": "1f380167923b228a3c3ab9caf4e7bb38d27228806cd6b0d9eb9fa49b2893c825",
    "long-decode": "23e39899e7c84d9069d657e250a0fe2436a6239f167a54809f58d12e64ed632c",
}
SLOW = {"long", "long-decode"}  # q.k over texts of 16K-64K keys: several seconds each


def suite_digest(name: str) -> str:
    h = hashlib.sha256()
    for case in synth.suite(name, "small"):
        head = [case.case_id, case.dtype, case.top_k, case.cols, case.row_stride, case.attrs]
        h.update(json.dumps(head, sort_keys=True).encode() + b"\0")
        for a in (case.values, case.offsets, case.row_starts, case.row_ends, case.reference_indices):
            h.update(b"-" if a is None else np.ascontiguousarray(a).view(np.uint8).tobytes())
            h.update(b"\0")
    return h.hexdigest()


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(PINNED)])
def test_suite_at_small_scale_is_what_was_pinned(name: str) -> None:
    assert suite_digest(name) == PINNED[name]


def test_every_built_in_suite_is_pinned() -> None:
    assert set(PINNED) == set(synth.SUITES)
