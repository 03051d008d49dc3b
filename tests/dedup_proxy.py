"""A forwarding TCP proxy that loses chosen SEND answers (issue 37's proof of the duplicate window).

It sits between clients and one broker (the broker advertises the proxy's address, so clients
find it through the NameServer), passes every byte on, and reads the remoting frames of both
directions: a request's opaque names its code and UNIQ_KEY; the response to a send the policy
picks is not passed back.  ``mode="close"`` then closes the client's connection (the client
sees the connection fail and resends at once); ``mode="silent"`` only swallows the answer (the
client resends after its timeout).  The broker stored the message either way: each resend is a
duplicate the window must catch.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Callable

from tidemq.message import Prop, string_to_properties
from tidemq.remoting.codec import decode_frame
from tidemq.remoting.codes import RequestCode

SEND_CODES = frozenset(
    (int(RequestCode.SEND_MESSAGE), int(RequestCode.SEND_MESSAGE_V2), int(RequestCode.SEND_BATCH_MESSAGE))
)
_LEN = struct.Struct(">I")


def request_key(fields: dict[str, str], body: bytes | None) -> str:
    """The send's UNIQ_KEY (a batch: its body's bytes' hash, one key per request)."""
    props = fields.get("properties") or fields.get("i") or ""
    key = string_to_properties(props).get(Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    return key or f"batch-{hash(body)}"


class DroppingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream``; ``drop(n, key)`` picks the send answers to lose
    (``n`` counts sends seen, from 0; ``key`` is the send's UNIQ_KEY)."""

    def __init__(self, upstream: str, drop: Callable[[int, str], bool], mode: str = "close") -> None:
        self.upstream = ("", 0)
        if upstream:
            self.set_upstream(upstream)
        self.drop = drop
        self.mode = mode
        self.sends = 0
        #: Every send's key, in arrival order, and the keys whose answers were lost.
        self.keys: list[str] = []
        self.dropped: list[str] = []
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dedup-proxy", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def set_upstream(self, upstream: str) -> None:
        """Where new connections go (settable after start: a broker advertising this proxy)."""
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> str:
        self.port = port
        self._thread.start()
        self._ready.wait(10)
        return self.address

    def stop(self) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(5)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._client, "127.0.0.1", self.port)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        pending: dict[int, str] = {}  # opaque -> the UNIQ_KEY of a send whose answer is to be lost

        async def upstream() -> None:
            while True:
                frame = await _frame(reader)
                if frame is None:
                    break
                cmd = decode_frame(frame)
                if cmd.code in SEND_CODES and not cmd.is_response:
                    key = request_key(cmd.ext_fields, cmd.body)
                    n = self.sends
                    self.sends += 1
                    self.keys.append(key)
                    if self.drop(n, key):
                        pending[cmd.opaque] = key
                up_writer.write(frame)
                await up_writer.drain()

        async def downstream() -> None:
            while True:
                frame = await _frame(up_reader)
                if frame is None:
                    break
                cmd = decode_frame(frame)
                key = pending.pop(cmd.opaque, None) if cmd.is_response else None
                if key is not None:
                    self.dropped.append(key)
                    if self.mode == "close":
                        break  # the stored message's answer never arrives; the connection fails
                    continue
                writer.write(frame)
                await writer.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except Exception:
            pass
        for task in tasks:
            task.cancel()
        for w in (writer, up_writer):
            w.close()


async def _frame(reader: asyncio.StreamReader) -> bytes | None:
    try:
        head = await reader.readexactly(4)
        (length,) = _LEN.unpack(head)
        return head + await reader.readexactly(length)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
