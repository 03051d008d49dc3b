"""Entry point of the index_hash plugin: registers the ``hash`` and ``none`` key indexes."""

from __future__ import annotations

from tidemq import hookimpl
from tidemq.config import parse_options
from tidemq.plugins import PluginContext, Register
from tidemq_index_hash.none import NoIndex, NoIndexOptions
from tidemq_index_hash.service import HashIndex, HashIndexOptions


def create_hash_index(ctx: PluginContext) -> HashIndex:
    options = parse_options(HashIndexOptions, ctx.options, "[index.hash]")
    return HashIndex(ctx.data_dir / "index", options)


def create_no_index(ctx: PluginContext) -> NoIndex:
    parse_options(NoIndexOptions, ctx.options, "[index.none]")
    return NoIndex()


@hookimpl
def tidemq_register_indexes(register: Register) -> None:
    register.add("hash", create_hash_index, "IndexFile hash index: messages by key and unique id")
    register.add("none", create_no_index, "no key index: queries by key find nothing")
