"""The key index contract (tidemq.testing.index_contract) run against the built-in indexes."""

from __future__ import annotations

from typing import Any, ClassVar

import tidemq_index_hash.plugin
from tidemq.plugins import PluginManager
from tidemq.testing.index_contract import KeyIndexContract


class _BuiltIn(KeyIndexContract):
    def plugin_manager(self) -> PluginManager:
        # Only this plugin: the contract must not depend on what else is installed.
        pm = PluginManager()
        pm.register(tidemq_index_hash.plugin, name="index_hash", distribution="tidemq")
        return pm


class TestHashIndexContract(_BuiltIn):
    index_name = "hash"
    index_options: ClassVar[dict[str, Any]] = {"max_hash_slot_num": 1024, "max_index_num": 8192}


class TestHashIndexTinyFilesContract(_BuiltIn):
    """Files of 16 entries over 7 slots: every test rolls files and walks collision chains."""

    index_name = "hash"
    index_options: ClassVar[dict[str, Any]] = {"max_hash_slot_num": 7, "max_index_num": 17}
    #: 600 keys still roll ~38 files under the readers (and flush twice); each query walks every file,
    #: so 1 500 took ~8 s here.
    concurrent_messages: ClassVar[int] = 600


class TestNoIndexContract(_BuiltIn):
    index_name = "none"
    indexes_keys = False
