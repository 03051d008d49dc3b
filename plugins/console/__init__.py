"""``tidemq console``: a web console in the spirit of rocketmq-dashboard.

Cluster (brokers, roles, TPS, disk, HA lag), topics (queues and offsets; create, delete),
consumer groups (lag per queue, online clients, subscriptions; reset offset by time, skip the
backlog), messages (by key, by id, by time range; body and properties; resend, e.g. out of a
DLQ), a send form and live charts of TPS and lag.  It talks to the cluster with RocketMQ's admin
requests, like ``tidemq admin``.  Bound to loopback by default; ``--acl`` asks for an admin
account's keys and signs every request with them.  Needs the ``console`` extra (Starlette,
Jinja2, uvicorn).
"""

from __future__ import annotations

import os

import click

from tidemq import hookimpl

DEFAULT_LISTEN = "127.0.0.1:8080"


@click.command("console")
@click.option(
    "-n",
    "--namesrv",
    default=os.environ.get("TIDEMQ_NAMESRV", "127.0.0.1:9876"),
    show_default=True,
    help="NameServer address(es), 'host:port;host:port' (or $TIDEMQ_NAMESRV).",
)
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, help="HOST:PORT the console serves on.")
@click.option(
    "--acl",
    is_flag=True,
    help="The brokers run the plain ACL: ask for an admin account's keys before showing anything.",
)
@click.option(
    "--access-key",
    envvar="TIDEMQ_ACCESS_KEY",
    help="ACL access key for every request (or $TIDEMQ_ACCESS_KEY).",
)
@click.option("--secret-key", envvar="TIDEMQ_SECRET_KEY", help="ACL secret key (or $TIDEMQ_SECRET_KEY).")
@click.option(
    "--tls-cafile", envvar="TIDEMQ_TLS_CAFILE", help="Use TLS to the cluster, trusting this CA file."
)
def console(
    namesrv: str,
    listen: str,
    acl: bool,
    access_key: str | None,
    secret_key: str | None,
    tls_cafile: str | None,
) -> None:
    """Serve the web console for the cluster behind NAMESRV."""
    from tidemq.cli import run_service

    try:
        from tidemq_console.server import serve
    except ImportError as exc:
        raise click.ClickException(
            f"the console needs the console extra ({exc.name} is missing): pip install 'tidemq[console]'"
        ) from None
    run_service(
        lambda: serve(
            namesrv, listen, acl=acl, access_key=access_key, secret_key=secret_key, tls_cafile=tls_cafile
        ),
        listen_hint="--listen HOST:PORT",
    )


@hookimpl
def tidemq_add_commands(cli: click.Group) -> None:
    cli.add_command(console)
