"""The ``[transport.grpc]`` table of a broker's TOML file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from tidemq.address import parse_address
from tidemq.config import number, parse_options
from tidemq.errors import ConfigError


def _listen(_instance: Any, _attribute: Any, value: str) -> None:
    parse_address(value, "[transport.grpc] listen", allow_port_zero=True)


def _server(_instance: Any, _attribute: Any, value: Any) -> None:
    if value not in ("grpcio", "native"):
        raise ValueError(f'server = {value!r}: takes "native" or "grpcio"')


@attrs.frozen
class GrpcOptions:
    #: host:port the gRPC service listens on (the RocketMQ proxy's default; port 0 picks one).
    listen: str = attrs.field(
        default="127.0.0.1:8081", validator=[attrs.validators.instance_of(str), _listen]
    )
    #: Largest request or response frame, bytes; larger ones get RESOURCE_EXHAUSTED.  Defaults to
    #: the broker's max_message_size plus room for the properties.
    max_frame_bytes: int = number(0, ge=0, le=2**31 - 1)
    #: Calls (streams) one client connection may have open at once (HTTP/2's
    #: SETTINGS_MAX_CONCURRENT_STREAMS): more wait for one to end, so one client cannot grow the
    #: broker's memory with streams without bound.
    max_concurrent_streams: int = number(100, ge=1, le=2**31 - 1)
    #: Calls (streams) the whole endpoint serves at once, every connection together; more are
    #: answered RESOURCE_EXHAUSTED at once.  With max_concurrent_streams per connection it bounds
    #: the memory clients can make the broker hold (about 34 KiB per open Telemetry stream:
    #: 10 000 of them, ~340 MiB; docs/grpc.md).
    max_concurrent_calls: int = number(10_000, ge=1, le=2**31 - 1)
    #: TLS: the server's certificate chain (PEM), with tls_keyfile; the RocketMQ 5 clients connect
    #: with ``tls_enable``.
    tls_certfile: str = ""
    #: TLS: the key of tls_certfile (PEM); both or neither.
    tls_keyfile: str = ""
    #: With TLS: clients must show a certificate signed by this CA (mutual TLS).
    tls_cafile: str = ""
    #: RocketMQ 5 proxy's enableTopicMessageTypeCheck: a message whose type the topic's
    #: ``message.type`` attribute does not take is refused MESSAGE_PROPERTY_CONFLICT_WITH_TYPE
    #: (a topic without the attribute takes NORMAL messages only).
    enable_topic_message_type_check: bool = attrs.field(
        default=True, validator=attrs.validators.instance_of(bool)
    )
    #: false: an address that cannot be bound (or a missing grpcio) is logged as a warning and the
    #: broker starts without the endpoint (``tidemq standalone``'s default endpoint); true: the
    #: broker's start fails, naming why.
    required: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    #: ReceiveMessage: the shortest invisible_duration taken (RocketMQ's minInvisibleTimeMillsForRecv).
    receive_min_invisible_ms: int = number(10_000, ge=0, le=12 * 3600 * 1000)
    #: ReceiveMessage: the shortest long polling (RocketMQ's grpcClientConsumerMinLongPollingTimeoutMillis).
    receive_min_polling_ms: int = number(5_000, ge=0, le=20_000)
    #: Which server speaks HTTP/2: ``"grpcio"`` (grpcio's ``grpc.aio`` server) or ``"native"``
    #: (tidemq_transport_grpc.h2_server: HTTP/2 on the broker's own event loop, about half the
    #: CPU per call; docs/grpc.md).  Both serve the same handlers.
    server: str = attrs.field(default="native", validator=_server)
    #: Seconds to let running calls finish when the broker stops.
    stop_grace: float = number(1.0, ge=0.0, le=60.0)


def grpc_options(values: Mapping[str, Any] | None) -> GrpcOptions:
    options = parse_options(GrpcOptions, values, "[transport.grpc]")
    if bool(options.tls_certfile) != bool(options.tls_keyfile):
        raise ConfigError("[transport.grpc] TLS needs both tls_certfile and tls_keyfile")
    if options.tls_cafile and not options.tls_certfile:
        raise ConfigError("[transport.grpc] tls_cafile (mutual TLS) needs tls_certfile and tls_keyfile")
    return options


def server_credentials(options: GrpcOptions) -> Any:
    """grpc's server credentials for ``options``' TLS files, or None without TLS."""
    return tls_credentials("[transport.grpc]", options.tls_certfile, options.tls_keyfile, options.tls_cafile)


def tls_credentials(section: str, certfile: str, keyfile: str, cafile: str = "") -> Any:
    """grpc's server credentials for PEM files: the certificate chain and its key, and with
    ``cafile`` the CA that signs the clients' certificates (mutual TLS); None without ``certfile``.
    A file that cannot be read is a :class:`~tidemq.errors.ConfigError` naming its key in
    ``section`` (``[transport.grpc] tls_keyfile = ...``)."""
    if not certfile:
        return None
    import grpc

    def read(key: str, path: str) -> bytes:
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{section} {key} = {path!r}: {exc.strerror or exc}") from exc

    pair = (read("tls_keyfile", keyfile), read("tls_certfile", certfile))
    ca = read("tls_cafile", cafile) if cafile else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)
