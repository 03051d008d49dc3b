"""Entry point of the grpc_proxy plugin: the ``tidemq proxy`` command."""

from __future__ import annotations

import logging
import tomllib
from typing import Any

from tidemq import hookimpl
from tidemq.errors import ConfigError

log = logging.getLogger(__name__)

#: Flags that override the [proxy] table, by key.
_FLAGS = ("namesrv", "listen", "advertise", "tls_certfile", "tls_keyfile", "tls_cafile", "acl_file")


def _table(config_path: str | None) -> dict[str, Any]:
    if not config_path:
        return {}
    try:
        with open(config_path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{config_path}: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{config_path}: not valid TOML: {exc}") from exc
    table = data.get("proxy", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{config_path}: [proxy] must be a table")
    return dict(table)


@hookimpl
def tidemq_add_commands(cli: Any) -> None:
    import click

    @cli.command("proxy")
    @click.option(
        "-c",
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        help="TOML file with a [proxy] table.",
    )
    @click.option("-n", "--namesrv", help="NameServer addresses, HOST:PORT separated by ';'.")
    @click.option("--listen", help="HOST:PORT the gRPC service listens on (default 127.0.0.1:8081).")
    @click.option("--advertise", help="HOST:PORT clients are routed to (default: the listen address).")
    @click.option("--tls-certfile", help="TLS: the server's certificate chain (PEM); with --tls-keyfile.")
    @click.option("--tls-keyfile", help="TLS: the certificate's key (PEM).")
    @click.option("--tls-cafile", help="Mutual TLS: clients must show a certificate signed by this CA.")
    @click.option(
        "--acl-file",
        help="plain_acl.yml: check clients' RocketMQ 5 signatures and permissions against it.",
    )
    @click.option("--insecure", is_flag=True, default=None, help="Listen beyond loopback without mutual TLS.")
    @click.option(
        "--access-key",
        envvar="TIDEMQ_ACCESS_KEY",
        default=None,
        help="Account signing the proxy's requests to brokers with an ACL. [env: TIDEMQ_ACCESS_KEY]",
    )
    @click.option("--secret-key", envvar="TIDEMQ_SECRET_KEY", default=None, help="[env: TIDEMQ_SECRET_KEY]")
    def proxy(
        config_path: str | None,
        insecure: bool | None,
        access_key: str | None,
        secret_key: str | None,
        **flags: str | None,
    ) -> None:
        """Run a RocketMQ 5 gRPC proxy in front of a NameServer's broker groups (cluster mode)."""
        from tidemq.cli import run_service, serve_until_signalled

        if bool(access_key) != bool(secret_key):
            raise click.UsageError("--access-key and --secret-key go together")

        async def main() -> None:
            from tidemq_transport_grpc.api import load_protobuf

            from .options import proxy_options
            from .server import ProxyServer

            table = _table(config_path)
            table.update({key: value for key, value in flags.items() if value})
            if insecure:
                table["insecure"] = True
            options = proxy_options(table)
            pb = load_protobuf()
            server = ProxyServer(options, pb, account=(access_key, secret_key) if access_key else None)
            await serve_until_signalled([("proxy", server)])

        run_service(main, listen_hint="--listen HOST:PORT (or [proxy] listen)")
