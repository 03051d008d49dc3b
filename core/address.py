"""``host:port`` strings: the one place that splits, validates and writes them.

* :func:`split_address` is the kernel every component uses on an address that is already known to
  be well formed (a validated config value, a socket's peer name, an address a NameServer or a
  master answered): it cuts at the last colon, as RocketMQ's ``RemotingHelper.string2SocketAddress``
  does, so an unbracketed IPv6 peer name (``::1:5555``) splits too.  A caller decides what a bad
  value means for it (a default, a :class:`~tidemq.errors.ConfigError`, a connect error).
* :func:`parse_address` checks a value a person wrote (a config key, a command-line flag) and names
  the key in a one-line :class:`~tidemq.errors.ConfigError`; :mod:`tidemq.config` re-exports it.
* :func:`format_address` is the inverse of both.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from tidemq.errors import ConfigError

_PORT = re.compile(r"[0-9]{1,10}")  # ASCII digits only: int() also takes "+80", "1_0" and full-width digits
_HOST = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")  # a host name or an IPv4 address


def split_address(address: str, *, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` -> ``(host, port)``, cut at the last colon; brackets around the host are dropped.

    ``[::1]:9876`` and ``::1:9876`` both give ``("::1", 9876)``.  The host may come back empty
    (``:9876``, or no colon at all: ``9876`` is a port alone).  No check of the host or of the
    port's range: that is :func:`parse_address`'s job, or the caller's.

    :class:`ValueError` when the port is not ASCII digits; with ``default_port``, a missing port
    (nothing after the last colon, or an empty ``address``) is ``default_port`` instead.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not port and default_port is not None:
        return host, default_port
    if not _PORT.fullmatch(port):
        raise ValueError(f"{address!r} is not host:port (port {port!r} is not a number)")
    return host, int(port)


def _address_problem(value: Any, allow_port_zero: bool) -> str | None:
    """Why ``value`` is not a ``HOST:PORT`` a person may write, or None when it is one."""
    if not isinstance(value, str):
        return "not a string"
    if value.startswith("["):
        host, sep, port = value[1:].partition("]:")
        if not sep:
            return "an IPv6 address in brackets needs :PORT after the ']'"
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r} is not an IPv6 address"
    else:
        host, sep, port = value.rpartition(":")
        if not sep:
            return "a port alone, add the host" if _PORT.fullmatch(value) else "no port"
        if ":" in host:
            return "write an IPv6 address in brackets"
        if not host:
            return "no host"
        if not _HOST.fullmatch(host):
            return f"{host!r} is not a host name or address"
    if not _PORT.fullmatch(port):
        return f"port {port!r} is not a number"
    lo = 0 if allow_port_zero else 1
    if not lo <= int(port) <= 65535:
        return f"port {int(port)} is outside {lo}..65535"
    return None


def parse_address(value: Any, key: str, *, allow_port_zero: bool = False) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) -> ``(host, port)``; a one-line error naming ``key``.

    ``key`` is the config key or the command-line flag the value came from.  Port 0 (any free
    port) is for addresses to listen on only: an address to reach needs a real one.
    """
    problem = _address_problem(value, allow_port_zero)
    if problem is not None:
        raise ConfigError(
            f"{key} = {value!r} is not HOST:PORT ({problem}); e.g. 127.0.0.1:10911 or [::1]:10911"
        )
    return split_address(value)


def format_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


__all__ = ["format_address", "parse_address", "split_address"]
