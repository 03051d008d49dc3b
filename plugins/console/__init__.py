"""``tidemq console``: a web console in the spirit of rocketmq-dashboard.

Cluster (brokers, roles, TPS, disk, HA lag), topics (queues and offsets; create, delete),
consumer groups (lag per queue, online clients, subscriptions; reset offset by time, skip the
backlog), messages (by key, by id, by time range; body and properties; resend, e.g. out of a
DLQ), a send form and live charts of TPS and lag.  It talks to the cluster with RocketMQ's admin
requests, like ``tidemq admin``.  Bound to loopback by default; ``--acl`` asks for an admin
account's keys and signs every request with them.  It answers only requests naming its own
address in ``Host`` (plus ``--public-host``), refuses to listen beyond loopback without ``--acl``
unless ``--insecure``, and bounds sessions, logins, request times and connections.  Needs the
``console`` extra (Starlette, Jinja2, uvicorn).
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
@click.option(
    "--public-host",
    multiple=True,
    help="Another NAME[:PORT] browsers reach the console by (its Host header), e.g. behind a proxy; "
    "repeatable. Only the listen address (and localhost on loopback) is trusted otherwise.",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="Listen beyond loopback without --acl: anyone who reaches the console administers the cluster.",
)
@click.option(
    "--request-timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.5, max=600),
    help="Seconds a request's headers and body may take to arrive.",
)
@click.option(
    "--idle-timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=1, max=600),
    help="Seconds an idle keep-alive connection stays open.",
)
@click.option(
    "--max-connections",
    default=64,
    show_default=True,
    type=click.IntRange(min=1, max=10_000),
    help="Connections served at once; more are closed at once.",
)
@click.option(
    "--max-sessions",
    default=64,
    show_default=True,
    type=click.IntRange(min=1, max=100_000),
    help="Sessions kept (made by a login or a form post); the least recently used goes first.",
)
@click.option(
    "--session-idle",
    default=1800.0,
    show_default=True,
    type=click.FloatRange(min=10),
    help="Seconds without a request after which a session ends.",
)
def console(
    namesrv: str,
    listen: str,
    acl: bool,
    access_key: str | None,
    secret_key: str | None,
    tls_cafile: str | None,
    public_host: tuple[str, ...],
    insecure: bool,
    request_timeout: float,
    idle_timeout: float,
    max_connections: int,
    max_sessions: int,
    session_idle: float,
) -> None:
    """Serve the web console for the cluster behind NAMESRV."""
    from tidemq.cli import run_service

    try:
        from tidemq_console.server import HttpLimits, serve
    except ImportError as exc:
        raise click.ClickException(
            f"the console needs the console extra ({exc.name} is missing): pip install 'tidemq[console]'"
        ) from None
    limits = HttpLimits(request_timeout, idle_timeout, max_connections)
    run_service(
        lambda: serve(
            namesrv,
            listen,
            acl=acl,
            access_key=access_key,
            secret_key=secret_key,
            tls_cafile=tls_cafile,
            public_hosts=public_host,
            insecure=insecure,
            limits=limits,
            max_sessions=max_sessions,
            session_idle_s=session_idle,
        ),
        listen_hint="--listen HOST:PORT",
    )


@hookimpl
def tidemq_add_commands(cli: click.Group) -> None:
    cli.add_command(console)
