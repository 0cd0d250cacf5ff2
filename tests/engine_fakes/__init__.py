"""Fakes of the serving engines' edges, written from the facts of their names, signatures and semantics;
the tests run the engines' released modules between them (tests/upstream_wheels.py fetches those, and
tests/test_no_upstream_copies.py checks that no fake copies their text)."""
