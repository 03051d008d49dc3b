"""Serving the console: uvicorn on a socket bound here, so the start-up line can name its port."""

from __future__ import annotations

import logging
import socket
import sys

import click
import uvicorn

from tidemq.address import format_address, parse_address
from tidemq.client import SessionCredentials
from tidemq.errors import ConfigError
from tidemq_console.app import ConsoleConfig, create_app

log = logging.getLogger(__name__)


async def serve(
    namesrv: str,
    listen: str,
    *,
    acl: bool = False,
    access_key: str | None = None,
    secret_key: str | None = None,
    tls_cafile: str | None = None,
) -> None:
    host, port = parse_address(listen, "--listen", allow_port_zero=True)
    if bool(access_key) != bool(secret_key):
        raise ConfigError("--access-key and --secret-key must be given together")
    credentials = SessionCredentials(access_key, secret_key) if access_key and secret_key else None
    options = {"tls": True, "tls_cafile": tls_cafile} if tls_cafile else {}
    app = create_app(ConsoleConfig(namesrv, acl=acl, credentials=credentials, transport_options=options))
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
    if host not in ("127.0.0.1", "::1", "localhost"):
        log.warning(
            "the console listens on %s: anyone who can reach it can administer the cluster%s",
            host,
            "" if acl else " (no --acl)",
        )
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    click.echo(f"tidemq console listening on http://{format_address(host, bound)}/")
    sys.stdout.flush()  # tests and scripts wait for this line
    await server.serve(sockets=[sock])
