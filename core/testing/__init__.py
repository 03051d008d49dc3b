"""Test kit for plugin authors: pytest fixtures and reusable contract suites (docs/testing_plugins.md).

``pip install tidemq`` registers the pytest plugin (:mod:`tidemq.testing.pytest_plugin`): fixtures
``tidemq_plugins``, ``tidemq_make_store`` and ``tidemq_make_broker``.  For a contract suite, subclass
``StoreContract``, ``KeyIndexContract``, ``FlushPolicyContract``, ``TransportContract`` or
``ReplicationContract`` (modules ``tidemq.testing.<role>_contract``) in a ``Test*`` class and give it
the factory fixture its docstring names: pytest then runs every contract test against your plugin.
"""

import pytest

# Before the suites are imported: their plain asserts then report the values that failed.
pytest.register_assert_rewrite(
    "tidemq.testing.flush_contract",
    "tidemq.testing.index_contract",
    "tidemq.testing.replication_contract",
    "tidemq.testing.store_contract",
    "tidemq.testing.transport_contract",
)
