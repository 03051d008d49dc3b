"""Entry point of the store_mmap plugin: registers the ``mmap`` store."""

from __future__ import annotations

from typing import Any

from tidemq import hookimpl
from tidemq.config import parse_options
from tidemq.errors import ConfigError
from tidemq.plugins import PluginContext, Register

from .options import MmapStoreOptions
from .store import MmapMessageStore


def create(ctx: PluginContext) -> MmapMessageStore:
    """Build the store from ``[store.mmap]``; the flush policy and key index come from ctx.components."""
    options = parse_options(MmapStoreOptions, ctx.options, "[store.mmap]")
    flush = ctx.components.get("flush")
    if flush is None:
        raise ConfigError('[store.mmap] needs a flush policy: set [plugins] flush = "sync" or "async"')
    return MmapMessageStore(ctx.data_dir, options, flush, ctx.components.get("index"), dict(ctx.settings))


@hookimpl
def tidemq_register_stores(register: Register) -> None:
    register.add("mmap", create, "RocketMQ-layout CommitLog and ConsumeQueues on memory-mapped files")


@hookimpl
def tidemq_add_commands(cli: Any) -> None:
    """``tidemq store verify <data-dir>``: the offline store verifier (verify.py)."""
    from .verify import store_command

    cli.add_command(store_command())
