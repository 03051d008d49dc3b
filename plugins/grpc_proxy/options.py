"""The proxy's settings: ``tidemq proxy`` flags, or a ``[proxy]`` table of a TOML file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tidemq.address import parse_address
from tidemq.client import split_namesrv
from tidemq.config import number, parse_options
from tidemq.errors import ConfigError
from tidemq.protected import Listener, check
from tidemq_transport_grpc.api import tls_credentials


def _listen(_instance: Any, _attribute: Any, value: str) -> None:
    parse_address(value, "[proxy] listen", allow_port_zero=True)


def _namesrv(_instance: Any, _attribute: Any, value: str) -> None:
    for address in split_namesrv(value):  # none at all: proxy_options says what is missing
        parse_address(address, "[proxy] namesrv")


@attrs.frozen
class ProxyOptions:
    #: The NameServers, ``host:port;host:port``.
    namesrv: str = attrs.field(default="", validator=[attrs.validators.instance_of(str), _namesrv])
    #: host:port the gRPC service listens on (RocketMQ's proxy default; port 0 picks one).
    listen: str = attrs.field(
        default="127.0.0.1:8081", validator=[attrs.validators.instance_of(str), _listen]
    )
    #: The address QueryRoute hands clients (default: the listen address; its host when a
    #: wildcard is this machine's address).
    advertise: str = ""
    #: Largest message body a client may send, bytes (the brokers' max_message_size).
    max_message_size: int = number(4 * 1024 * 1024, ge=1, le=2**31 - 64 * 1024 - 1)
    #: Calls (streams) one client connection may have open at once.
    max_concurrent_streams: int = number(100, ge=1, le=2**31 - 1)
    #: Calls (streams) the proxy serves at once, every connection together; more are answered
    #: RESOURCE_EXHAUSTED at once (as ``[transport.grpc] max_concurrent_calls``).
    max_concurrent_calls: int = number(10_000, ge=1, le=2**31 - 1)
    #: Seconds a remoting request to a broker or NameServer may take (a pull adds its wait).
    request_timeout: float = number(3.0, ge=0.1, le=600.0)
    #: Seconds between refreshes of the cached routes.
    route_refresh_s: float = number(30.0, ge=0.1, le=3600.0)
    #: Seconds between the proxy's heartbeats to the brokers (its producer registrations).
    heartbeat_s: float = number(30.0, ge=0.1, le=3600.0)
    #: A consumer's attempts before its message goes to the dead-letter queue (clients' Settings).
    max_reconsume_times: int = number(16, ge=0, le=10_000)
    #: ReceiveMessage: the shortest invisible_duration taken (RocketMQ's minInvisibleTimeMillsForRecv).
    receive_min_invisible_ms: int = number(10_000, ge=0, le=12 * 3600 * 1000)
    #: ReceiveMessage: the shortest long polling (RocketMQ's grpcClientConsumerMinLongPollingTimeoutMillis).
    receive_min_polling_ms: int = number(5_000, ge=0, le=20_000)
    #: Refuse a message of a type its topic's ``message.type`` does not take (RocketMQ 5's
    #: proxy's enableTopicMessageTypeCheck, as ``[transport.grpc]``'s).
    enable_topic_message_type_check: bool = True
    #: TLS: the server's certificate chain (PEM), with tls_keyfile.
    tls_certfile: str = ""
    tls_keyfile: str = ""
    #: With TLS: clients must show a certificate signed by this CA (mutual TLS).
    tls_cafile: str = ""
    #: RocketMQ's plain ACL file (plain_acl.yml, as a broker's ``[acl.plain] file``): the proxy
    #: checks every client's RocketMQ 5 signature and permissions against it, as RocketMQ 5's
    #: proxy does (unsigned or badly signed calls: UNAUTHORIZED; no permission: FORBIDDEN); it
    #: talks to the brokers with its own account (--access-key).  Reloaded when it changes.
    acl_file: str = ""
    #: Run open beyond loopback without mutual TLS or an ACL (protected mode refuses it otherwise).
    insecure: bool = False
    #: Seconds running calls get when the proxy stops.
    stop_grace: float = number(1.0, ge=0.0, le=60.0)


def proxy_options(values: Mapping[str, Any] | None) -> ProxyOptions:
    options = parse_options(ProxyOptions, values, "[proxy]")
    if not options.namesrv:
        raise ConfigError("the proxy needs its NameServers: --namesrv HOST:PORT (or [proxy] namesrv)")
    if bool(options.tls_certfile) != bool(options.tls_keyfile):
        raise ConfigError(
            "[proxy] TLS needs both tls_certfile and tls_keyfile (--tls-certfile, --tls-keyfile)"
        )
    if options.tls_cafile and not options.tls_certfile:
        raise ConfigError("[proxy] tls_cafile (mutual TLS) needs tls_certfile and tls_keyfile")
    if options.advertise:
        parse_address(options.advertise, "[proxy] advertise")
    host = parse_address(options.listen, "[proxy] listen", allow_port_zero=True)[0]
    check(
        Listener(
            what="gRPC proxy",
            host=host,
            authenticated=bool(options.tls_cafile or options.acl_file),
            fix="require client certificates with --tls-cafile (mutual TLS), or signed calls with --acl-file",
            insecure_option="[proxy] insecure (--insecure)",
            insecure=options.insecure,
        )
    )
    return options


def server_credentials(options: ProxyOptions) -> Any:
    """grpc's server credentials for the TLS files, or None without TLS."""
    return tls_credentials("[proxy]", options.tls_certfile, options.tls_keyfile, options.tls_cafile)
