"""Entry point of the filter_server plugin: the ``TAG`` and ``SQL92`` filter types, ``tidemq filtersrv``."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Any

import attrs

from tidemq import hookimpl
from tidemq.address import split_address
from tidemq.config import number, parse_options
from tidemq.errors import ConfigError
from tidemq.filter import EXPRESSION_SQL92, EXPRESSION_TAG
from tidemq.plugins import PluginContext, Register, get_plugin_manager

from .bitmap import FilterBitMap
from .sql92 import Sql92FilterFactory, Sql92Limits
from .tag import TagFilterFactory

log = logging.getLogger(__name__)


@attrs.define
class Sql92Options:
    """``[filter.SQL92]``: expression bounds and the dispatch-time bloom pre-check (ConsumeQueueExt)."""

    bloom_precheck: bool = True  # RocketMQ's enableCalcFilterBitMap + enableConsumeQueueExt
    bloom_bits: int = 64
    bloom_hashes: int = 3
    max_entries_per_queue: int = 1 << 22
    # a filter no pull used for this long stops being computed
    idle_expire_s: float = number(3600.0, gt=0, le=7 * 86400)
    # each registration is evaluated for every message of its topic: beyond these, no pre-check
    max_registrations_per_topic: int = number(32, ge=1, le=4096)
    max_registrations: int = number(1024, ge=1, le=65536)
    # an expression is compiled on the event loop: these bound what one compile can cost
    max_expression_length: int = number(16384, ge=16, le=1 << 20)
    max_expression_tokens: int = number(200, ge=8, le=10_000)
    max_expression_depth: int = number(64, ge=4, le=200)


def create_tag(ctx: PluginContext) -> TagFilterFactory:
    if ctx.options:
        raise ConfigError(f"[filter.TAG] takes no options, got: {', '.join(sorted(ctx.options))}")
    return TagFilterFactory()


def create_sql92(ctx: PluginContext) -> Sql92FilterFactory:
    opts = parse_options(Sql92Options, ctx.options, "[filter.SQL92]")
    limits = Sql92Limits(
        max_length=opts.max_expression_length,
        max_tokens=opts.max_expression_tokens,
        max_depth=opts.max_expression_depth,
    )
    precheck = None
    # Only beside a store: the broker attaches the bit map to it (Sql92FilterFactory.dispatchers);
    # a filter server or a check-config run has no store to feed one.
    if opts.bloom_precheck and ctx.components.get("store") is not None:
        try:
            precheck = FilterBitMap(
                bits=opts.bloom_bits,
                hashes=opts.bloom_hashes,
                max_entries_per_queue=opts.max_entries_per_queue,
                idle_expire_s=opts.idle_expire_s,
                max_registrations_per_topic=opts.max_registrations_per_topic,
                max_registrations=opts.max_registrations,
            )
        except ValueError as exc:
            raise ConfigError(f"[filter.SQL92]: {exc}") from exc
    return Sql92FilterFactory(precheck, limits)


@hookimpl
def tidemq_add_commands(cli: Any) -> None:
    import click

    @cli.command("filtersrv")
    @click.option("--broker", "broker_addr", required=True, help="HOST:PORT of the broker to serve.")
    @click.option("--listen", default="127.0.0.1:0", show_default=True, help="HOST:PORT to serve pulls on.")
    @click.option(
        "--register-interval", default=10.0, show_default=True, help="Seconds between registrations."
    )
    @click.option(
        "--acl-file",
        default=None,
        type=click.Path(dir_okay=False, exists=True),
        help="The broker's plain_acl.yml: every consumer pull is checked against it before it is forwarded.",
    )
    @click.option(
        "--access-key",
        envvar="TIDEMQ_ACCESS_KEY",
        default=None,
        help="Account signing the registration and the forwarded pulls (an admin account). "
        "[env: TIDEMQ_ACCESS_KEY]",
    )
    @click.option("--secret-key", envvar="TIDEMQ_SECRET_KEY", default=None, help="[env: TIDEMQ_SECRET_KEY]")
    @click.option(
        "--insecure",
        is_flag=True,
        help="Forward unchecked pulls: with credentials, or listening beyond loopback, without --acl-file.",
    )
    def filtersrv(
        broker_addr: str,
        listen: str,
        register_interval: float,
        acl_file: str | None,
        access_key: str | None,
        secret_key: str | None,
        insecure: bool,
    ) -> None:
        """Run a filter server: pulls from BROKER on consumers' behalf with installed filter plugins."""
        from tidemq.cli import run_service, serve_until_signalled

        from .filtersrv import FilterServer

        if bool(access_key) != bool(secret_key):
            raise click.UsageError("--access-key and --secret-key go together")
        if acl_file is None and not insecure:
            if access_key:
                raise click.UsageError(
                    "--access-key without --acl-file would forward anyone's pull with this account's "
                    "rights: give --acl-file (the broker's plain_acl.yml), or --insecure"
                )
            if not _loopback(listen):
                raise click.UsageError(
                    f"--listen {listen} reaches beyond this machine and nothing checks the pulls: "
                    "give --acl-file (the broker's plain_acl.yml), or --insecure on a trusted network"
                )
        acl = None
        if acl_file is not None:
            acl = get_plugin_manager().create("acl", "plain", options={"file": str(Path(acl_file).resolve())})
        credentials = (access_key, secret_key) if access_key and secret_key else None

        async def main() -> None:
            server = FilterServer(
                broker_addr,
                listen,
                register_interval_s=register_interval,
                acl=acl,
                credentials=credentials,
            )
            await serve_until_signalled([("filtersrv", server)])

        run_service(main)


def _loopback(listen: str) -> bool:
    host = split_address(listen, default_port=0)[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@hookimpl
def tidemq_register_filters(register: Register) -> None:
    register.add(EXPRESSION_TAG, create_tag, "tags joined by '||' or '*', matched by tag code then exact tag")
    register.add(
        EXPRESSION_SQL92,
        create_sql92,
        "RocketMQ SQL92 selector on message properties, with a dispatch-time bloom pre-check",
    )
