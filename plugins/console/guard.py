"""What the console trusts: Host and Origin headers, sessions, login attempts.

* :class:`HostGuard` (ASGI middleware) answers only requests whose ``Host`` names the console
  (its bound address, ``localhost`` when it listens on loopback, and every ``--public-host``) and
  whose ``Origin``, when a browser sends one, is such a host too.  A DNS-rebinding page (a page
  from ``attacker.example`` whose name then resolves to 127.0.0.1) sends ``Host:
  attacker.example``: it is refused before any handler runs.
* :class:`SessionStore` holds at most ``max_sessions`` sessions, each expiring after
  ``idle_s`` without a request or ``lifetime_s`` after it was made; the least recently used
  goes first when the store is full.
* :class:`LoginThrottle` refuses logins from a client after repeated failures, and from anyone
  after many failures overall.
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, Generic, TypeVar

from tidemq.address import format_address

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class TrustedHosts:
    """The ``Host`` values (``name`` or ``name:port``, lower case) the console answers to."""

    def __init__(self, bind_host: str, port: int, public_hosts: Iterable[str] = ()) -> None:
        names: set[str] = set()
        if bind_host not in _WILDCARDS:
            names.add(format_address(bind_host, port).lower())
        if bind_host in _WILDCARDS or is_loopback(bind_host):
            # The machine itself: a browser on it may name the console either way.
            for local in ("localhost", "127.0.0.1", "::1"):
                names.add(format_address(local, port).lower())
        for public in public_hosts:
            public = public.strip().lower()
            if not public:
                continue
            names.add(public)
            if not _has_port(public):  # behind a proxy on 80/443, or reached on the bound port
                names.add(format_address(public.strip("[]"), port).lower())
        if port in (80, 443):  # a browser leaves the scheme's default port out of Host
            names |= {name.rsplit(":", 1)[0] for name in names if _has_port(name)}
        self.names = frozenset(names)

    def allows(self, host: str) -> bool:
        return host.strip().lower() in self.names

    def allows_origin(self, origin: str) -> bool:
        scheme, sep, rest = origin.strip().partition("://")
        return bool(sep) and scheme.lower() in ("http", "https") and "/" not in rest and self.allows(rest)


def _has_port(host: str) -> bool:
    if host.startswith("["):
        return "]:" in host
    return host.count(":") == 1


class HostGuard:
    """Refuses requests naming another host (421) or coming from another origin (403)."""

    def __init__(self, app: ASGIApp, hosts: TrustedHosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = origin = None
            for key, value in scope["headers"]:
                if key == b"host":
                    if host is not None:  # two Host headers: which one would a proxy have read?
                        return await _refuse(send, 400, "two Host headers")
                    host = value.decode("latin-1")
                elif key == b"origin":
                    origin = value.decode("latin-1")
            if host is None or not self.hosts.allows(host):
                return await _refuse(
                    send,
                    421,
                    "untrusted Host header: this console answers only to its own address "
                    "(tidemq console --public-host NAME adds one)",
                )
            if origin is not None and not self.hosts.allows_origin(origin):
                return await _refuse(send, 403, "cross-origin request refused")
        await self.app(scope, receive, send)


async def _refuse(send: Send, status: int, text: str) -> None:
    body = text.encode() + b"\n"
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


S = TypeVar("S")


class SessionStore(Generic[S]):
    """Sessions by id, capped and expired; what is dropped is handed to ``dropped`` to release."""

    def __init__(self, max_sessions: int, idle_s: float, lifetime_s: float) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.lifetime_s = lifetime_s
        # id -> (session, created, last used); ordered from least to most recently used
        self._items: OrderedDict[str, tuple[S, float, float]] = OrderedDict()
        #: Sessions expired or evicted whose resources are not released yet (see :meth:`reap`).
        self.dropped: list[S] = []

    def __len__(self) -> int:
        return len(self._items)

    def _expired(self, created: float, used: float, now: float) -> bool:
        return now - used > self.idle_s or now - created > self.lifetime_s

    def get(self, token: str | None, now: float | None = None) -> S | None:
        if not token:
            return None
        item = self._items.get(token)
        if item is None:
            return None
        now = time.monotonic() if now is None else now
        session, created, used = item
        if self._expired(created, used, now):
            self.drop(token)
            return None
        self._items[token] = (session, created, now)
        self._items.move_to_end(token)
        return session

    def add(self, token: str, session: S, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for old, (_, created, used) in list(self._items.items()):
            if self._expired(created, used, now):
                self.drop(old)
        while len(self._items) >= self.max_sessions:
            self.drop(next(iter(self._items)))  # the least recently used
        self._items[token] = (session, now, now)

    def drop(self, token: str) -> None:
        item = self._items.pop(token, None)
        if item is not None:
            self.dropped.append(item[0])

    def all(self) -> list[S]:
        return [item[0] for item in self._items.values()]

    def reap(self) -> list[S]:
        """The dropped sessions, once: the caller releases what they hold."""
        out, self.dropped = self.dropped, []
        return out


class LoginThrottle:
    """At most ``per_client`` failed logins per client and ``overall`` in all per ``window_s``."""

    def __init__(self, per_client: int = 5, overall: int = 30, window_s: float = 60.0) -> None:
        self.per_client = per_client
        self.overall = overall
        self.window_s = window_s
        self._clients: dict[str, deque[float]] = {}
        self._all: deque[float] = deque()

    def _trim(self, q: deque[float], now: float) -> None:
        while q and now - q[0] > self.window_s:
            q.popleft()

    def retry_after(self, client: str, now: float | None = None) -> float:
        """0 when ``client`` may try to log in now, else the seconds to wait."""
        now = time.monotonic() if now is None else now
        self._trim(self._all, now)
        q = self._clients.get(client)
        if q is not None:
            self._trim(q, now)
            if not q:
                del self._clients[client]
        waits = []
        if q is not None and len(q) >= self.per_client:
            waits.append(q[0] + self.window_s - now)
        if len(self._all) >= self.overall:
            waits.append(self._all[0] + self.window_s - now)
        return max(waits, default=0.0)

    def failed(self, client: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if len(self._clients) > 10_000:  # a flood from many addresses: keep memory bounded
            self._clients.clear()
        self._clients.setdefault(client, deque()).append(now)
        self._all.append(now)
