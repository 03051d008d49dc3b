"""Options of the tcp transport: the ``[transport.tcp]`` table."""

from __future__ import annotations

import logging
import ssl
from typing import Any

import attrs

from tidemq.config import DAY_S, number, parse_options
from tidemq.errors import ConfigError

log = logging.getLogger(__name__)


@attrs.define
class TcpOptions:
    """``[transport.tcp]``; server()/client() accept the same keys as keyword overrides."""

    max_frame_size: int = 16 * 1024 * 1024
    #: Server side: bytes all connections of one server may hold in partial (not yet whole) frames
    #: together.  A read that pushes the total over it closes the connection holding the largest
    #: partial frame.  The server never budgets below one max_frame_size plus growth slack, so one
    #: frame of the largest allowed size always fits (max_frame_size may come from [broker]).
    max_buffered_bytes: int = 64 * 1024 * 1024
    #: Server side: close a connection that sent and received nothing for this long (0 = never).
    idle_timeout_s: float = number(120.0, ge=0, le=DAY_S)
    connect_timeout_s: float = number(3.0, gt=0, le=DAY_S)
    #: Stop reading a connection's requests while its unsent responses exceed this many bytes.
    write_high_water: int = 4 * 1024 * 1024
    write_low_water: int = 1024 * 1024
    #: Server side: stop reading a connection while this many of its requests are being handled
    #: (resumes at half); together with the write high-water mark this bounds a connection's memory.
    max_in_flight: int = 1024
    backlog: int = number(1024, ge=1, le=65535)
    #: Gather the frames written during one event-loop turn into one writev (fewer syscalls under
    #: load; a lone frame waits only for the end of the current turn).
    coalesce_writes: bool = True
    #: Send pull bodies read from mapped store files with sendfile (no copy in from user space),
    #: written straight to the socket while the transport buffers nothing; never under TLS; needs
    #: coalesce_writes.  Off by default: with RocketMQ's 32-message pulls of 1 KiB it cost more CPU
    #: per message than one writev per loop turn (0.56-0.72x, bench/results/2026-11-24/ab_sendfile*.json).
    sendfile: bool = False
    #: Start each request's handler inside data_received and make a Task only if it has to wait;
    #: a send waiting on a future (its sync flush round) is parked on it instead, the sends of a
    #: round resumed together with one callback per connection.
    eager_requests: bool = True
    #: Server side: offer each read's bytes to the handler's request lane first (the broker's
    #: compiled send lane: frames, headers, put and answers without a command object per request;
    #: issue 38), when the handler has one.  Off: every frame is decoded and served in Python.
    read_lane: bool = True
    #: Server side: while a connection's read waits for its sync flush round (the send lane holds
    #: it), read nothing more from it until that round answers; what arrived meanwhile is then
    #: served in one read.  The sends that arrive during a round's ``fdatasync`` wait for the next
    #: round either way; read at once they came in small reads (half the messages per read and per
    #: put of async flush), and the loop's CPU per message follows the messages per read
    #: (docs/flush.md, "Single sends under sync flush").  Only after a read of two sends or more:
    #: a lone sender's next send cannot be there, and a pause and resume cost two syscalls.  Off:
    #: read as they arrive.
    hold_reading_for_round: bool = True
    #: Server side, with hold_reading_for_round: the longest a connection's reading is held for its
    #: round (microseconds); then it is read again even if the round has not answered (a slow or
    #: hung ``fdatasync``), so a pull, heartbeat or query behind the sends on that connection waits
    #: about this long at most, not the whole round.  The sends read then wait for their round as
    #: before, and until the connection's sends are all answered a read of even one send holds it
    #: again (with a new bound).  The loop's timers count whole milliseconds.  On a busy disk
    #: (holds of 1-2 ms median, 7-10 ms p90) 2000 lost ~9 % a message where 5000 lost none
    #: measurable (docs/flush.md, "A held connection's other requests"); on a quiet one a round is
    #: well under a millisecond and no hold reaches the bound.
    hold_reading_max_us: int = number(5000, ge=1, le=10_000_000)
    #: TLS: a server needs certfile+keyfile; a client verifies the server against cafile when given.
    tls: bool = False
    tls_certfile: str = ""
    tls_keyfile: str = ""
    tls_cafile: str = ""
    #: Client side, with tls_cafile: the server's certificate must name the address dialled (on by
    #: default: without it any certificate from the CA, CN=evil.example included, passes for any server).
    tls_check_hostname: bool = True

    def __attrs_post_init__(self) -> None:
        if self.max_frame_size < 1024:
            raise ValueError(f"max_frame_size = {self.max_frame_size} is too small (minimum 1024)")
        if self.max_buffered_bytes <= 0:
            raise ValueError(f"max_buffered_bytes = {self.max_buffered_bytes} must be positive")
        if self.max_in_flight < 1:
            raise ValueError(f"max_in_flight = {self.max_in_flight} must be at least 1")
        if self.write_low_water > self.write_high_water:
            raise ValueError("write_low_water must not exceed write_high_water")

    def server_ssl(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        if not (self.tls_certfile and self.tls_keyfile):
            raise ConfigError("[transport.tcp] tls = true needs tls_certfile and tls_keyfile for a server")
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            ctx.load_cert_chain(self.tls_certfile, self.tls_keyfile)
            if self.tls_cafile:  # mutual TLS: clients must show a certificate signed by this CA
                ctx.load_verify_locations(self.tls_cafile)
                ctx.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"[transport.tcp] cannot load TLS files: {exc}") from exc
        return ctx

    def client_ssl(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        try:
            if self.tls_cafile:
                ctx.load_verify_locations(self.tls_cafile)
                ctx.check_hostname = self.tls_check_hostname
                if not self.tls_check_hostname:
                    _warn(
                        "TLS client with tls_check_hostname = false: any certificate signed by "
                        f"{self.tls_cafile} is accepted for any server, so one node can impersonate another"
                    )
            else:  # no CA given: encrypt without verifying (RocketMQ's default client TLS mode)
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
                _warn(
                    "TLS client without tls_cafile: the server is not verified (encryption only; "
                    "anyone in the path can pose as it); set [transport.tcp] tls_cafile (or --tls-cafile)"
                )
            if self.tls_certfile and self.tls_keyfile:
                ctx.load_cert_chain(self.tls_certfile, self.tls_keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"[transport.tcp] cannot load TLS files: {exc}") from exc
        return ctx

    def with_overrides(self, overrides: dict[str, Any], where: str) -> TcpOptions:
        if not overrides:
            return self
        return parse_options(TcpOptions, {**attrs.asdict(self), **overrides}, where)


def _warn(text: str) -> None:
    """Once per client made (a process makes few: its broker, admin or producer clients)."""
    log.warning("%s", text)


def parse_tcp_options(values: dict[str, Any] | None, where: str = "[transport.tcp]") -> TcpOptions:
    return parse_options(TcpOptions, values, where)
