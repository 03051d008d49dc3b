"""The ``tidemq admin`` click group and what every command shares: ``_run`` (connection flags,
one-line errors), table and timestamp formatting, printing a message as mqadmin does."""

from __future__ import annotations

import asyncio
import functools
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import click

# The RPC client lives in tidemq.client.admin; these names stay importable from here.
from tidemq.client.admin import TIMEOUT_S, AdminClient, AdminError
from tidemq.errors import TidemqError
from tidemq.message import MessageExt

DEFAULT_NAMESRV = os.environ.get("TIDEMQ_NAMESRV", "127.0.0.1:9876")
TOOLS_GROUP = "TOOLS_CONSUMER"
PRODUCER_GROUP = "TOOLS_PRODUCER"

__all__ = ["DEFAULT_NAMESRV", "TIMEOUT_S", "AdminClient", "AdminError", "admin"]


def _run(fn: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    """Run an async command body with an AdminClient; errors become one line and exit code 1."""

    @functools.wraps(fn)
    def wrapper(
        namesrv: str,
        access_key: str | None,
        secret_key: str | None,
        tls_cafile: str | None,
        tls_certfile: str | None,
        tls_keyfile: str | None,
        **kwargs: Any,
    ) -> None:
        async def main() -> None:
            client = AdminClient(
                namesrv,
                credentials=_credentials(access_key, secret_key),
                transport_options=_tls_options(tls_cafile, tls_certfile, tls_keyfile),
            )
            try:
                await fn(client, **kwargs)
            finally:
                await client.close()

        try:
            asyncio.run(main())
        except TidemqError as exc:
            click.echo(f"tidemq admin: error: {exc}", err=True)
            sys.exit(1)

    for flag, env, text in reversed(
        [
            ("--tls-cafile", "TIDEMQ_TLS_CAFILE", "Use TLS, trusting servers signed by this CA file"),
            ("--tls-certfile", "TIDEMQ_TLS_CERTFILE", "Client certificate for mutual TLS"),
            ("--tls-keyfile", "TIDEMQ_TLS_KEYFILE", "Key of --tls-certfile"),
        ]
    ):
        wrapper = click.option(flag, envvar=env, help=f"{text} (or ${env}).")(wrapper)
    wrapper = click.option(
        "--secret-key",
        envvar="TIDEMQ_SECRET_KEY",
        help="ACL secret key (or $TIDEMQ_SECRET_KEY).",
    )(wrapper)
    wrapper = click.option(
        "--access-key",
        envvar="TIDEMQ_ACCESS_KEY",
        help="ACL access key for brokers with access control (or $TIDEMQ_ACCESS_KEY).",
    )(wrapper)
    return click.option(
        "-n",
        "--namesrv",
        default=DEFAULT_NAMESRV,
        show_default=True,
        help="NameServer address(es), 'host:port;host:port'.",
    )(wrapper)


def _tls_options(cafile: str | None, certfile: str | None, keyfile: str | None) -> dict[str, Any]:
    """The tcp transport's TLS options from the --tls-* flags (none: plaintext)."""
    if not (cafile or certfile or keyfile):
        return {}
    opts: dict[str, Any] = {"tls": True}
    for key, value in (("tls_cafile", cafile), ("tls_certfile", certfile), ("tls_keyfile", keyfile)):
        if value:
            opts[key] = value
    return opts


def _credentials(access_key: str | None, secret_key: str | None) -> Any:
    """SessionCredentials from the --access-key/--secret-key flags, None without them."""
    if not access_key and not secret_key:
        return None
    if not (access_key and secret_key):
        raise AdminError("--access-key and --secret-key must be given together")
    from tidemq.client.credentials import SessionCredentials

    return SessionCredentials(access_key, secret_key)


def _table(rows: list[list[Any]], header: list[str]) -> None:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=False)]
    for row in [header, *rows]:
        click.echo("  ".join(str(v).ljust(w) for v, w in zip(row, widths, strict=False)).rstrip())


def _fmt_ts(ms: int) -> str:
    if ms <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f",{ms % 1000:03d}"


def _print_message(msg: MessageExt) -> None:
    click.echo(f"OffsetID:            {msg.msg_id}")
    click.echo(f"Topic:               {msg.topic}")
    click.echo(f"Tags:                [{msg.tags or ''}]")
    click.echo(f"Keys:                [{' '.join(msg.keys)}]")
    click.echo(f"Queue ID:            {msg.queue_id}")
    click.echo(f"Queue Offset:        {msg.queue_offset}")
    click.echo(f"CommitLog Offset:    {msg.commit_log_offset}")
    click.echo(f"Reconsume Times:     {msg.reconsume_times}")
    click.echo(f"Born Timestamp:      {_fmt_ts(msg.born_timestamp)}")
    click.echo(f"Store Timestamp:     {_fmt_ts(msg.store_timestamp)}")
    click.echo(f"Born Host:           {msg.born_host[0]}:{msg.born_host[1]}")
    click.echo(f"Store Host:          {msg.store_host[0]}:{msg.store_host[1]}")
    click.echo(f"Properties:          {msg.properties}")
    click.echo(f"Message Body:        {msg.body.decode('utf-8', 'replace')}")


@click.group("admin")
def admin() -> None:
    """Operate a tidemq (or RocketMQ) cluster: topics, routes, consumer progress, messages."""
