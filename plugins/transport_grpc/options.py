"""The ``[transport.grpc]`` table of a broker's TOML file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tidemq.address import parse_address
from tidemq.config import number, parse_options


def _listen(_instance: Any, _attribute: Any, value: str) -> None:
    parse_address(value, "[transport.grpc] listen", allow_port_zero=True)


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
    #: Seconds to let running calls finish when the broker stops.
    stop_grace: float = number(1.0, ge=0.0, le=60.0)


def grpc_options(values: Mapping[str, Any] | None) -> GrpcOptions:
    return parse_options(GrpcOptions, values, "[transport.grpc]")
