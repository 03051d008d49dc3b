"""Remote address patterns of ``plain_acl.yml`` (RocketMQ's RemoteAddressStrategyFactory).

Supported spellings: ``*`` / ``*.*.*.*`` (any address), one address (IPv4 or IPv6),
``192.168.0.*`` / ``192.168.*.*`` (any value from the first ``*`` on), ``192.168.1.1-100`` (a
range in one octet, later octets ``*``), ``192.168.1.{1,2,3}`` and ``a,b,c`` (a list).  A blank
pattern matches nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from tidemq.errors import ConfigError

Matcher = Callable[[str], bool]


class AddressPatternError(ConfigError):
    """A white address pattern that RocketMQ's syntax does not allow."""


def host_of(remote_addr: str) -> str:
    """``host`` from ``host:port`` / ``[v6]:port`` (RocketMQ cuts at the last colon)."""
    host = remote_addr.rsplit(":", 1)[0] if ":" in remote_addr else remote_addr
    return host.strip("[]")


def _canonical(addr: str) -> str | None:
    try:
        ip = ipaddress.ip_address(addr.strip())
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)  # a dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d
    return ip.exploded


def _exact(addr: str, pattern: str) -> Matcher:
    want = _canonical(addr)
    if want is None:
        raise AddressPatternError(f"white address {pattern!r}: {addr!r} is not an IP address")
    return lambda host: _canonical(host) == want


def _octet(text: str, pattern: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise AddressPatternError(f"white address {pattern!r}: {text!r} is not a number") from None
    if not 0 <= value <= 255:
        raise AddressPatternError(f"white address {pattern!r}: {value} is outside 0-255")
    return value


def _range(pattern: str) -> Matcher:
    parts = pattern.split(".")
    if len(parts) != 4:
        raise AddressPatternError(f"white address {pattern!r}: a range needs four IPv4 octets")
    head: list[int] = []
    for index, part in enumerate(parts):
        part = part.strip()
        if part == "*" or "-" in part:
            if index == 0:
                raise AddressPatternError(f"white address {pattern!r}: the first octet must be a number")
            if part == "*":
                low, high = 0, 255
            else:
                a, _, b = part.partition("-")
                if not a:
                    raise AddressPatternError(f"white address {pattern!r}: range {part!r} has no start")
                low, high = _octet(a, pattern), _octet(b, pattern)
                if low > high:
                    raise AddressPatternError(f"white address {pattern!r}: range {part!r} is empty")
            if any(p.strip() != "*" for p in parts[index + 1 :]):
                raise AddressPatternError(f"white address {pattern!r}: octets after a range must be '*'")
            break
        head.append(_octet(part, pattern))
    else:  # no '*' or range: one address after all
        return _exact(pattern, pattern)
    index = len(head)

    def match(host: str) -> bool:
        canon = _canonical(host)
        if canon is None or ":" in canon:
            return False
        octets = [int(x) for x in canon.split(".")]
        return octets[:index] == head and low <= octets[index] <= high

    return match


def compile_pattern(pattern: object) -> Matcher:
    """A matcher of host strings for one ``whiteRemoteAddress`` pattern."""
    if pattern is None or (isinstance(pattern, str) and not pattern.strip()):
        return lambda host: False
    if not isinstance(pattern, str):
        raise AddressPatternError(f"white address {pattern!r} must be a string")
    pattern = pattern.strip()
    if pattern in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        return lambda host: True
    if pattern.endswith("}"):
        head, brace, tail = pattern.rpartition("{")
        if not brace or not head.endswith((".", ":")):
            raise AddressPatternError(f"white address {pattern!r}: a list must follow the last '.'")
        return _any([_exact(head + item.strip(), pattern) for item in tail[:-1].split(",") if item.strip()])
    if "," in pattern:
        return _any([_exact(item, pattern) for item in pattern.split(",") if item.strip()])
    if "*" in pattern or ("-" in pattern and ":" not in pattern):
        return _range(pattern)
    return _exact(pattern, pattern)


def _any(matchers: list[Matcher]) -> Matcher:
    return lambda host: any(m(host) for m in matchers)
