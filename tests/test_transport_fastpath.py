"""The tcp transport's fast paths: handlers started inside data_received, frames gathered per loop turn."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from tidemq.plugins import get_plugin_manager
from tidemq.remoting import RemotingCommand, ResponseCode
from tidemq.remoting.codec import FrameDecoder, encode_bytes
from tidemq_transport_tcp import run

pytestmark = pytest.mark.timeout(60)


def transport(**options: Any) -> Any:
    return get_plugin_manager().create("transport", "tcp", options=options)


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "task"])
def test_handlers_that_wait_fail_or_finish_at_once_all_answer(eager: bool) -> None:
    """Immediate answers, answers after waits, and errors raised after a wait each reach the caller."""

    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            kind = req.ext_fields["kind"]
            if kind == "sleep":
                await asyncio.sleep(0.01)
            elif kind == "yield":
                await asyncio.sleep(0)
            elif kind == "fail":
                await asyncio.sleep(0.005)
                raise RuntimeError("boom after a wait")
            elif kind == "future":
                fut = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_later(0.01, fut.set_exception, KeyError("late"))
                try:
                    await fut
                except KeyError:
                    return req.reply(ResponseCode.SYSTEM_BUSY, remark="caught")
            return req.reply(ext_fields={"kind": kind})

        t = transport(eager_requests=eager)
        server = t.server("127.0.0.1", 0, handler)
        await server.start()
        client = t.client()
        try:
            addr = "{}:{}".format(*server.address)
            kinds = ["now", "sleep", "yield", "fail", "future"] * 20
            resps = await asyncio.gather(
                *(client.invoke(addr, RemotingCommand.request(10, {"kind": k}), 5) for k in kinds)
            )
            for kind, resp in zip(kinds, resps, strict=True):
                if kind == "fail":
                    assert resp.code == ResponseCode.SYSTEM_ERROR and "boom after a wait" in (
                        resp.remark or ""
                    )
                elif kind == "future":
                    assert (resp.code, resp.remark) == (ResponseCode.SYSTEM_BUSY, "caught")
                else:
                    assert resp.code == ResponseCode.SUCCESS and resp.ext_fields["kind"] == kind
        finally:
            await client.close()
            await server.stop()

    run(main())


def test_pipelined_requests_sent_in_one_write_all_come_back_in_order() -> None:
    """200 requests in one write: answers gathered per loop turn still arrive whole and in order."""

    async def main() -> None:
        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            return req.reply(body=req.body)

        server = transport().server("127.0.0.1", 0, handler)
        await server.start()
        try:
            reqs = [RemotingCommand.request(10, body=b"%d" % i) for i in range(200)]
            reader, writer = await asyncio.open_connection(*server.address)
            writer.write(b"".join(encode_bytes(r) for r in reqs))
            decoder = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < len(reqs):
                chunk = await asyncio.wait_for(reader.read(1 << 20), 5)
                assert chunk
                got += decoder.feed(chunk)
            assert [c.body for c in got] == [r.body for r in reqs]  # no awaits: answered in order
            assert all(c.opaque == r.opaque for c, r in zip(got, reqs, strict=True))
            writer.close()
        finally:
            await server.stop()

    run(main())


def test_stop_cancels_a_started_handler_still_waiting() -> None:
    """A handler begun inside data_received and then parked is still cancelled by stop()."""

    async def main() -> None:
        cancelled = asyncio.Event()

        async def handler(conn: Any, req: RemotingCommand) -> RemotingCommand:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.set()
                raise
            return req.reply()

        server = transport().server("127.0.0.1", 0, handler)
        await server.start()
        sock = socket.create_connection(server.address)
        try:
            sock.sendall(encode_bytes(RemotingCommand.request(10)))
            await asyncio.sleep(0.2)
            await server.stop(drain_timeout=0.2)
            await asyncio.wait_for(cancelled.wait(), 2)
        finally:
            sock.close()

    run(main())


class _EchoLane:
    """A handler with a request lane: leading frames of code 77 are answered from the read's bytes
    (as the broker's send lane answers sends); everything else by the handler, decoded."""

    def __init__(self) -> None:
        self.lane_reads = 0

    async def __call__(self, conn: Any, req: RemotingCommand) -> RemotingCommand:
        return req.reply(body=b"decoded:" + req.body)

    def serve_read(self, conn: Any, data: bytes, max_frame: int) -> tuple[int, bytes] | None:
        decoder = FrameDecoder(max_frame)
        answers: list[bytes] = []
        end = 0
        for cmd in decoder.feed(data):
            if cmd.code != 77:
                break
            reply = cmd.reply(body=b"lane:" + cmd.body)
            reply.flag |= 1  # FLAG_RESPONSE
            answers.append(encode_bytes(reply))
            end += len(encode_bytes(cmd))
        if not answers:
            return None
        self.lane_reads += 1
        return end, b"".join(answers)


def test_a_lane_answer_leaves_after_what_waits_for_the_loop_turn_and_at_once_otherwise() -> None:
    """A request lane's answers to a read are written at once when nothing waits for the end of the
    loop turn, and behind what waits otherwise: the peer reads every answer in the order written."""

    async def main() -> None:
        handler = _EchoLane()
        server = transport().server("127.0.0.1", 0, handler)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(*server.address)
            for _ in range(100):
                if server.connections:
                    break
                await asyncio.sleep(0.01)
            conn = server.connections[0]
            late = RemotingCommand.request(10, body=b"late")
            late_answer = late.reply(body=b"sent first")
            late_answer.opaque = late.opaque
            lane_req = RemotingCommand.request(77, body=b"one")
            # In one step of the loop: an answer waits for the turn's end, then a read the lane serves.
            conn.send_response(late_answer)
            conn.data_received(encode_bytes(lane_req))
            # Nothing waiting: the lane's answer (and the decoded request's after it) through the socket.
            lane_then_decoded = [
                RemotingCommand.request(77, body=b"two"),
                RemotingCommand.request(10, body=b"x"),
            ]
            writer.write(b"".join(encode_bytes(r) for r in lane_then_decoded))
            decoder = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < 4:
                chunk = await asyncio.wait_for(reader.read(1 << 20), 5)
                assert chunk
                got += decoder.feed(chunk)
            assert [c.body for c in got] == [b"sent first", b"lane:one", b"lane:two", b"decoded:x"]
            assert [c.opaque for c in got] == [late.opaque, lane_req.opaque] + [
                r.opaque for r in lane_then_decoded
            ]
            assert handler.lane_reads == 2
            writer.close()
        finally:
            await server.stop()

    run(main())
