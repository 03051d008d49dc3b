"""tidemq_flush: the ``sync`` (group commit) and ``async`` (periodic) flush policies.

The transient-store-pool variant (write to an off-map buffer, commit, then flush) is a store
option, ``[store.mmap] transient_store_pool = true``; both policies commit before they flush, and
``[flush.async] commit_interval_ms`` paces the commits.
"""

from __future__ import annotations

from tidemq import hookimpl
from tidemq.config import parse_options
from tidemq.plugins import PluginContext, Register

from .group_commit import GroupCommitFlush, SyncFlushOptions
from .periodic import AsyncFlushOptions, PeriodicFlush

__all__ = ["AsyncFlushOptions", "GroupCommitFlush", "PeriodicFlush", "SyncFlushOptions"]


def create_sync(ctx: PluginContext) -> GroupCommitFlush:
    return GroupCommitFlush(parse_options(SyncFlushOptions, ctx.options, "[flush.sync]"))


def create_async(ctx: PluginContext) -> PeriodicFlush:
    return PeriodicFlush(parse_options(AsyncFlushOptions, ctx.options, "[flush.async]"))


@hookimpl
def tidemq_register_flush_policies(register: Register) -> None:
    register.add("sync", create_sync, "group commit: writers wait for fsync, batched behind one flush")
    register.add("async", create_async, "periodic flush: acknowledge at once, flush every interval")
