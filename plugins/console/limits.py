"""uvicorn's HTTP/1.1 protocol with a request timeout and a connection cap.

uvicorn closes a keep-alive connection that stays idle (``timeout_keep_alive``) but has no limit
on how long a request may take to arrive: a client sending one header byte every few seconds
holds its connection (and a file descriptor) for ever, and nothing caps how many it opens.  Here
a request whose headers and body have not fully arrived ``request_timeout_s`` after its first
byte could come (the connection's start, or the end of the previous response) is dropped, and a
connection beyond ``max_connections`` is closed as soon as it is accepted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def bounded_protocol(request_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """An :class:`H11Protocol` subclass with these limits (uvicorn's ``Config(http=...)``)."""

    class BoundedH11Protocol(H11Protocol):
        _request_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                log.warning("console: more than %d connections, closing a new one", max_connections)
                transport.close()
                return
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._request_timer = self.loop.call_later(request_timeout_s, self._request_timed_out)

        def _disarm(self) -> None:
            if self._request_timer is not None:
                self._request_timer.cancel()
                self._request_timer = None

        def _request_timed_out(self) -> None:
            self._request_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            # The request is in once the peer has sent all of it; what follows is the app's time.
            if self.conn.their_state in (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR):
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start a pipelined request already received
            if not self.transport.is_closing() and self.conn.their_state in (h11.IDLE, h11.SEND_BODY):
                self._arm()  # the next request on this connection gets the same time

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return BoundedH11Protocol
