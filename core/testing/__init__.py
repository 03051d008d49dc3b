"""Test helpers for plugin authors: reusable contract suites (see :mod:`tidemq.testing.store_contract`)."""
