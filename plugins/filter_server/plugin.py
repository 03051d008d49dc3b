"""Entry point of the filter_server plugin: the ``TAG`` and ``SQL92`` filter types, ``tidemq filtersrv``."""

from __future__ import annotations

import logging
from typing import Any

import attrs

from tidemq import hookimpl
from tidemq.config import parse_options
from tidemq.errors import ConfigError
from tidemq.filter import EXPRESSION_SQL92, EXPRESSION_TAG
from tidemq.plugins import PluginContext, Register

from .bitmap import FilterBitMap
from .sql92 import Sql92FilterFactory
from .tag import TagFilterFactory

log = logging.getLogger(__name__)


@attrs.define
class Sql92Options:
    """``[filter.SQL92]``: the dispatch-time bloom pre-check (RocketMQ's ConsumeQueueExt)."""

    bloom_precheck: bool = True  # RocketMQ's enableCalcFilterBitMap + enableConsumeQueueExt
    bloom_bits: int = 64
    bloom_hashes: int = 3
    max_entries_per_queue: int = 1 << 22
    idle_expire_s: float = 3600.0  # a filter no pull used for this long stops being computed


def create_tag(ctx: PluginContext) -> TagFilterFactory:
    if ctx.options:
        raise ConfigError(f"[filter.TAG] takes no options, got: {', '.join(sorted(ctx.options))}")
    return TagFilterFactory()


def create_sql92(ctx: PluginContext) -> Sql92FilterFactory:
    opts = parse_options(Sql92Options, ctx.options, "[filter.SQL92]")
    store: Any = ctx.components.get("store")
    precheck = None
    if opts.bloom_precheck and store is not None and hasattr(store, "add_dispatcher"):
        try:
            precheck = FilterBitMap(
                bits=opts.bloom_bits,
                hashes=opts.bloom_hashes,
                max_entries_per_queue=opts.max_entries_per_queue,
                idle_expire_s=opts.idle_expire_s,
            )
        except ValueError as exc:
            raise ConfigError(f"[filter.SQL92]: {exc}") from exc
        store.add_dispatcher(precheck)
    return Sql92FilterFactory(precheck)


@hookimpl
def tidemq_add_commands(cli: Any) -> None:
    import click

    @cli.command("filtersrv")
    @click.option("--broker", "broker_addr", required=True, help="HOST:PORT of the broker to serve.")
    @click.option("--listen", default="127.0.0.1:0", show_default=True, help="HOST:PORT to serve pulls on.")
    @click.option(
        "--register-interval", default=10.0, show_default=True, help="Seconds between registrations."
    )
    def filtersrv(broker_addr: str, listen: str, register_interval: float) -> None:
        """Run a filter server: pulls from BROKER on consumers' behalf with installed filter plugins."""
        from tidemq.cli import run_service, serve_until_signalled

        from .filtersrv import FilterServer

        async def main() -> None:
            server = FilterServer(broker_addr, listen, register_interval_s=register_interval)
            await serve_until_signalled([("filtersrv", server)])

        run_service(main)


@hookimpl
def tidemq_register_filters(register: Register) -> None:
    register.add(EXPRESSION_TAG, create_tag, "tags joined by '||' or '*', matched by tag code then exact tag")
    register.add(
        EXPRESSION_SQL92,
        create_sql92,
        "RocketMQ SQL92 selector on message properties, with a dispatch-time bloom pre-check",
    )
