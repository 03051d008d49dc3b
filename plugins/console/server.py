"""Serving the console: uvicorn on a socket bound here, so the start-up line can name its port."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Sequence

import attrs
import click
import uvicorn

from tidemq.address import format_address, parse_address
from tidemq.client import SessionCredentials
from tidemq.errors import ConfigError
from tidemq_console.app import ConsoleConfig, create_app
from tidemq_console.guard import HostGuard, TrustedHosts, is_loopback
from tidemq_console.limits import bounded_protocol

log = logging.getLogger(__name__)


@attrs.define
class HttpLimits:
    """How long a request may take to arrive, how long an idle connection stays, how many there are."""

    request_timeout_s: float = 10.0
    idle_timeout_s: float = 5.0
    max_connections: int = 64


async def serve(
    namesrv: str,
    listen: str,
    *,
    acl: bool = False,
    access_key: str | None = None,
    secret_key: str | None = None,
    tls_cafile: str | None = None,
    public_hosts: Sequence[str] = (),
    insecure: bool = False,
    limits: HttpLimits | None = None,
    max_sessions: int = 64,
    session_idle_s: float = 1800.0,
) -> None:
    limits = limits or HttpLimits()
    host, port = parse_address(listen, "--listen", allow_port_zero=True)
    if bool(access_key) != bool(secret_key):
        raise ConfigError("--access-key and --secret-key must be given together")
    if not is_loopback(host) and not acl:
        if not insecure:
            raise ConfigError(
                f"--listen {listen} reaches beyond this machine and the console asks for no keys: "
                "add --acl (the brokers' admin keys are asked for at login), or --insecure on a trusted network"
            )
        log.warning(
            "the console listens on %s without --acl (--insecure): anyone who can reach it can "
            "administer the cluster",
            host,
        )
    credentials = SessionCredentials(access_key, secret_key) if access_key and secret_key else None
    options = {"tls": True, "tls_cafile": tls_cafile} if tls_cafile else {}
    config = ConsoleConfig(
        namesrv,
        acl=acl,
        credentials=credentials,
        transport_options=options,
        max_sessions=max_sessions,
        session_idle_s=session_idle_s,
    )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    bound = sock.getsockname()[1]
    app = HostGuard(create_app(config), TrustedHosts(host, bound, public_hosts))
    uv_config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="on",
        access_log=False,
        http=bounded_protocol(limits.request_timeout_s, limits.max_connections),
        timeout_keep_alive=max(1, round(limits.idle_timeout_s)),
        proxy_headers=False,  # no X-Forwarded-For: the login throttle counts real peers
    )
    server = uvicorn.Server(uv_config)
    click.echo(f"tidemq console listening on http://{format_address(host, bound)}/")
    sys.stdout.flush()  # tests and scripts wait for this line
    await server.serve(sockets=[sock])
