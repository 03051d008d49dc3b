"""Request coalescing: pipelined sends that arrive in one read are stored with one put per queue.

Each test writes its frames to a real broker on loopback in one ``write`` (so the broker reads them
in one go) and reads the answers back.  How many puts the store made is observed through a filter
plugin whose dispatcher the broker attaches to the store (``PUTLOG`` below): the store hands every
put to it, once per put.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tidemq import hookimpl
from tidemq.acl import sign_request
from tidemq.address import split_address
from tidemq.message import (
    BatchItem,
    Prop,
    decode_message,
    decode_message_id,
    encode_batch,
    properties_to_string,
)
from tidemq.plugins import PluginManager
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import stringify_fields
from tidemq.testing.pytest_plugin import running_broker

pytestmark = pytest.mark.timeout(60)

TOPIC = "Coalesced"


class PutLog:
    """A batch dispatcher: the store calls it once per put with that put's records."""

    def __init__(self) -> None:
        self.puts: list[tuple[str, int, int, int]] = []  # topic, queue, first queue offset, records

    def dispatch_batch(
        self,
        topic: str,
        queue_id: int,
        properties: Any,
        commit_log_offsets: Any,
        sizes: Any,
        tags_codes: Any,
        store_timestamp: int,
        queue_offset: int,
        sys_flags: Any,
    ) -> None:
        self.puts.append((topic, queue_id, queue_offset, len(commit_log_offsets)))

    def of(self, topic: str) -> list[tuple[int, int, int]]:
        return [(q, off, n) for t, q, off, n in self.puts if t == topic]


class PutLogFilters:
    """Filter type ``PUTLOG``: filters nothing, and has the broker attach :class:`PutLog` to its store."""

    def __init__(self, log: PutLog) -> None:
        self.log = log

    def compile(self, expression: str) -> Any:
        raise ValueError("PUTLOG filters nothing")

    def dispatchers(self) -> list[PutLog]:
        return [self.log]

    def close(self) -> None:
        pass


class PutLogPlugin:
    def __init__(self) -> None:
        self.log = PutLog()

    @hookimpl
    def tidemq_register_filters(self, register: Any) -> None:
        register.add("PUTLOG", lambda ctx: PutLogFilters(self.log), "test: records the store's puts")


class SendHooks:
    """Records every send hook call; vetoes messages carrying the property ``VETO``."""

    def __init__(self) -> None:
        self.before: list[str] = []
        self.after: list[tuple[str, str, str, int]] = []  # body tag, status, msg id, queue offset

    @hookimpl
    def tidemq_before_send(self, context: Any) -> str | None:
        self.before.append(context.properties.get("N", "?"))
        return "vetoed by test" if "VETO" in context.properties else None

    @hookimpl
    def tidemq_after_send(self, context: Any) -> None:
        self.after.append(
            (context.properties.get("N", "?"), context.status, context.msg_id, context.queue_offset)
        )


def plugins_with(*extra: Any) -> PluginManager:
    manager = PluginManager()
    manager.load_entry_points()
    for i, plugin in enumerate(extra):
        manager.register(plugin, name=f"coalescing-test-{i}")
    return manager


@asynccontextmanager
async def broker_with(
    tmp_path: Path, plugin_matrix: dict[str, str], *extra: Any, **settings: Any
) -> AsyncIterator[Any]:
    options = settings.pop("options", None)
    async with running_broker(
        tmp_path / "broker", plugin_matrix, options=options, manager=plugins_with(*extra), **settings
    ) as broker:
        yield broker


def v2(topic: str, queue_id: int | str, n: int, **props: str) -> dict[str, str]:
    """A SEND_MESSAGE_V2 header as the official client writes it; property ``N`` numbers the message."""
    properties = {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"{n:032X}", "N": str(n), **props}
    return {
        "a": "PG",
        "b": topic,
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": "0",
        "g": str(int(time.time() * 1000)),
        "h": "0",
        "i": properties_to_string(properties),
        "j": "0",
        "k": "false",
        "m": "false",
    }


def frame(code: int, fields: dict[str, Any], body: bytes | None, opaque: int) -> bytes:
    return encode_bytes(RemotingCommand(code, opaque=opaque, ext_fields=stringify_fields(fields), body=body))


async def pipelined(address: str, requests: list[RemotingCommand]) -> list[RemotingCommand]:
    """Write ``requests`` in one write on a new connection; their responses, in request order."""
    host, port = split_address(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        return await exchange(reader, writer, requests)
    finally:
        writer.close()


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, requests: list[RemotingCommand]
) -> list[RemotingCommand]:
    writer.write(b"".join(encode_bytes(r) for r in requests))
    await writer.drain()
    decoder = FrameDecoder()
    got: dict[int, RemotingCommand] = {}
    while len(got) < len(requests):
        data = await asyncio.wait_for(reader.read(1 << 16), 10)
        assert data, f"connection closed after {len(got)} of {len(requests)} responses"
        for cmd in decoder.feed(data):
            got[cmd.opaque] = cmd
    return [got[r.opaque] for r in requests]


def sends(specs: list[tuple[int | str, int, dict[str, str]]], topic: str = TOPIC) -> list[RemotingCommand]:
    """SEND_MESSAGE_V2 requests from ``(queue, n, properties)``: body ``m<n>``, opaques 1.."""
    return [
        RemotingCommand(
            RequestCode.SEND_MESSAGE_V2,
            opaque=i + 1,
            ext_fields=v2(topic, queue, n, **props),
            body=f"m{n}".encode(),
        )
        for i, (queue, n, props) in enumerate(specs)
    ]


async def create_topic(broker: Any, topic: str = TOPIC, queues: int = 4) -> None:
    fields = {"topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": 6}
    req = RemotingCommand(RequestCode.UPDATE_AND_CREATE_TOPIC, opaque=1, ext_fields=stringify_fields(fields))
    (resp,) = await pipelined(broker.address, [req])
    assert resp.code == ResponseCode.SUCCESS, resp


def queue_bodies(broker: Any, topic: str, queue_id: int) -> list[bytes]:
    result = broker.store.get_message("CG", topic, queue_id, 0, 64)
    return [decode_message(bytes(b)).body for b in result.buffers]


def stored_body(broker: Any, msg_id: str) -> bytes:
    _host, offset = decode_message_id(msg_id)
    raw = broker.store.look_message_by_offset(offset)
    assert raw is not None
    return decode_message(raw).body


def run(coro: Callable[[], Any]) -> None:
    asyncio.run(coro())


# --------------------------------------------------------------------------- tests


def test_pipelined_sends_get_one_put_per_queue_and_their_own_ids(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    recorder = PutLogPlugin()

    async def main() -> None:
        async with broker_with(tmp_path, plugin_matrix, recorder) as broker:
            await create_topic(broker)
            requests = sends([(n % 4, n, {}) for n in range(16)])  # round robin, as clients choose
            responses = await pipelined(broker.address, requests)
            assert [r.code for r in responses] == [ResponseCode.SUCCESS] * 16, responses
            # One put per queue, each with that queue's four messages.
            assert sorted(recorder.log.of(TOPIC)) == [(q, 0, 4) for q in range(4)]
            ids = [r.ext_fields["msgId"] for r in responses]
            assert len(set(ids)) == 16
            for n, r in enumerate(responses):
                assert r.ext_fields["queueId"] == str(n % 4)
                assert r.ext_fields["queueOffset"] == str(n // 4)
                assert stored_body(broker, r.ext_fields["msgId"]) == f"m{n}".encode()

    run(main)


def test_pipelined_sends_keep_their_order_in_each_queue(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    recorder = PutLogPlugin()

    async def main() -> None:
        async with broker_with(tmp_path, plugin_matrix, recorder) as broker:
            await create_topic(broker)
            order = [0, 0, 1, 0, 2, 1, 0, 3, 3, 1, 0, 2]
            requests = sends([(q, n, {}) for n, q in enumerate(order)])
            batch = RemotingCommand(  # a batch send between them is put in its place in queue 0
                RequestCode.SEND_BATCH_MESSAGE,
                opaque=len(requests) + 1,
                ext_fields={**v2(TOPIC, 0, 99), "m": "true"},
                body=encode_batch([BatchItem(b"b0", 0, {}), BatchItem(b"b1", 0, {})]),
            )
            late = sends([(0, 50, {})])[0]
            late.opaque = len(requests) + 2
            responses = await pipelined(broker.address, [*requests, batch, late])
            assert all(r.code == ResponseCode.SUCCESS for r in responses), responses
            for q in range(4):
                expected = [f"m{n}".encode() for n, qq in enumerate(order) if qq == q]
                if q == 0:
                    expected += [b"b0", b"b1", b"m50"]
                assert queue_bodies(broker, TOPIC, q) == expected
            assert responses[-2].ext_fields["queueOffset"] == "5"  # after queue 0's five singles
            assert responses[-1].ext_fields["queueOffset"] == "7"
            assert len(recorder.log.of(TOPIC)) < len(order) + 2  # coalesced, not one put per request

    run(main)


def test_pipelined_batch_sends_share_a_put_and_keep_their_own_ids(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    recorder = PutLogPlugin()

    async def main() -> None:
        async with broker_with(tmp_path, plugin_matrix, recorder) as broker:
            await create_topic(broker)
            requests = []
            for n in range(4):  # queues 0, 1, 0, 1; three messages each
                items = [BatchItem(f"b{n}.{i}".encode(), 0, {"N": f"{n}.{i}"}) for i in range(3)]
                requests.append(
                    RemotingCommand(
                        RequestCode.SEND_BATCH_MESSAGE,
                        opaque=n + 1,
                        ext_fields={**v2(TOPIC, n % 2, 100 + n), "m": "true"},
                        body=encode_batch(items),
                    )
                )
            responses = await pipelined(broker.address, requests)
            assert all(r.code == ResponseCode.SUCCESS for r in responses), responses
            assert sorted(recorder.log.of(TOPIC)) == [(0, 0, 6), (1, 0, 6)]
            for n, r in enumerate(responses):
                ids = r.ext_fields["msgId"].split(",")
                assert [stored_body(broker, i) for i in ids] == [f"b{n}.{i}".encode() for i in range(3)]
                assert r.ext_fields["queueOffset"] == str(3 * (n // 2))

    run(main)


def test_one_bad_message_in_a_pipelined_read_fails_alone(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    hooks = SendHooks()
    recorder = PutLogPlugin()

    async def main() -> None:
        async with broker_with(tmp_path, plugin_matrix, hooks, recorder, max_message_size=4096) as broker:
            await create_topic(broker)
            requests = sends([(0, n, {}) for n in range(10)])
            requests[2].ext_fields["e"] = "not-a-number"  # a bad header
            requests[4].body = b"x" * 8192  # over max_message_size: the store refuses it
            requests[6].ext_fields["i"] = properties_to_string({"N": "6", "VETO": "1"})  # a hook's veto
            requests[8].ext_fields["b"] = "bad/topic"  # a name the rules refuse
            responses = await pipelined(broker.address, requests)
            codes = [r.code for r in responses]
            ok = ResponseCode.SUCCESS
            assert codes == [
                ok,
                ok,
                ResponseCode.SYSTEM_ERROR,
                ok,
                ResponseCode.MESSAGE_ILLEGAL,
                ok,
                ResponseCode.NO_PERMISSION,
                ok,
                ResponseCode.SYSTEM_ERROR,
                ok,
            ], [(r.code, r.remark) for r in responses]
            assert "queueId" in (responses[2].remark or "")
            assert responses[6].remark == "vetoed by test"
            good = [0, 1, 3, 5, 7, 9]
            assert [responses[n].ext_fields["queueOffset"] for n in good] == [str(i) for i in range(6)]
            assert queue_bodies(broker, TOPIC, 0) == [f"m{n}".encode() for n in good]
            assert "queueOffset" not in responses[4].ext_fields  # the failed one has no offset
            # The store refused the queue's put for message 4; the halves around it stay coalesced.
            assert sum(n for _q, _off, n in recorder.log.of(TOPIC)) == len(good)
            assert len(recorder.log.of(TOPIC)) < len(good)

    run(main)


def test_failed_sends_in_pipelined_reads_leave_no_cycles(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    """A bad header fails its request alone without a reference cycle per failure (a flood of them
    must not pile up for the collector; see tests/test_broker_gc.py)."""

    async def main() -> int:
        async with broker_with(tmp_path, plugin_matrix) as broker:
            await create_topic(broker)
            reader, writer = await asyncio.open_connection(*split_address(broker.address))
            try:  # one connection throughout: opening and closing ones leaves asyncio's cycles
                await exchange(reader, writer, sends([(0, 0, {})]))
                gc.collect()
                gc.disable()
                try:
                    for r in range(6):
                        requests = sends([(n % 4, n, {}) for n in range(40)])
                        for n, req in enumerate(requests):
                            req.opaque = 1000 * r + n + 1
                            if n % 5 == 2:
                                req.ext_fields["e"] = "not-a-number"
                        responses = await exchange(reader, writer, requests)
                        assert [r.code for r in responses].count(ResponseCode.SYSTEM_ERROR) == 8
                    await asyncio.sleep(0.05)
                    return gc.collect()
                finally:
                    gc.enable()
            finally:
                writer.close()

    assert asyncio.run(main()) < 40


def test_send_hooks_run_once_per_coalesced_message(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    hooks = SendHooks()
    recorder = PutLogPlugin()

    async def main() -> None:
        async with broker_with(tmp_path, plugin_matrix, hooks, recorder) as broker:
            await create_topic(broker)
            responses = await pipelined(broker.address, sends([(n % 2, n, {}) for n in range(8)]))
            assert all(r.code == ResponseCode.SUCCESS for r in responses)
            assert len(recorder.log.of(TOPIC)) == 2
            assert hooks.before == [str(n) for n in range(8)]
            # Under sync flush puts resolve in any order: compare the calls, not their order.
            assert sorted(hooks.after) == sorted(
                (str(n), "SUCCESS", r.ext_fields["msgId"], int(r.ext_fields["queueOffset"]))
                for n, r in enumerate(responses)
            )

    run(main)


def test_a_store_that_raises_fails_each_coalesced_send_with_its_error(
    tmp_path: Path, plugin_matrix: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault injection (a real store does not raise): every send of the put is answered, and
    its hook told, with the store's error; a single send the same way."""
    hooks = SendHooks()

    def broken(*args: Any) -> Any:
        raise OSError("disk on fire")

    async def main() -> None:
        async with broker_with(tmp_path, plugin_matrix, hooks) as broker:
            await create_topic(broker)
            monkeypatch.setattr(broker.store, "put_messages", broken)
            monkeypatch.setattr(broker.store, "put_message", broken)
            responses = await pipelined(broker.address, sends([(0, n, {}) for n in range(4)]))
            (single,) = await pipelined(broker.address, sends([(1, 9, {})]))
            for r in [*responses, single]:
                assert (r.code, r.remark) == (ResponseCode.SYSTEM_ERROR, "store error: disk on fire")
            assert [(n, status) for n, status, _id, _off in hooks.after] == [
                (str(n), "SYSTEM_ERROR") for n in (0, 1, 2, 3, 9)
            ]

    run(main)


ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: producer-ak
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Coalesced=PUB
  - accessKey: admin-ak
    secretKey: admin-secret
    admin: true
"""


def test_access_is_checked_per_coalesced_request(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(ACL)
    recorder = PutLogPlugin()
    options = {"acl": {"plain": {"file": str(acl_file)}}}

    async def main() -> None:
        async with broker_with(
            tmp_path, {**plugin_matrix, "acl": "plain"}, recorder, options=options
        ) as broker:
            create = RemotingCommand(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                opaque=1,
                ext_fields=stringify_fields(
                    {"topic": TOPIC, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}
                ),
            )
            sign_request(create, "admin-ak", "admin-secret")
            assert (await pipelined(broker.address, [create]))[0].code == ResponseCode.SUCCESS
            requests = sends([(0, n, {}) for n in range(5)])
            for n in (0, 2, 4):
                sign_request(requests[n], "producer-ak", "producer-secret")
            sign_request(requests[3], "producer-ak", "wrong-secret")  # request 1 is not signed at all
            responses = await pipelined(broker.address, requests)
            assert [r.code for r in responses] == [
                ResponseCode.SUCCESS,
                ResponseCode.NO_PERMISSION,
                ResponseCode.SUCCESS,
                ResponseCode.NO_PERMISSION,
                ResponseCode.SUCCESS,
            ], [(r.code, r.remark) for r in responses]
            assert [responses[n].ext_fields["queueOffset"] for n in (0, 2, 4)] == ["0", "1", "2"]
            assert queue_bodies(broker, TOPIC, 0) == [b"m0", b"m2", b"m4"]
            assert recorder.log.of(TOPIC) == [(0, 0, 3)]

    run(main)


def test_a_wrapped_send_code_is_served_one_request_at_a_time(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    recorder = PutLogPlugin()
    seen: list[int] = []

    class Wrapper:
        @hookimpl
        def tidemq_register_processors(self, register: Any) -> None:
            def wrap(handler: Any) -> Any:
                async def wrapped(conn: Any, request: RemotingCommand) -> Any:
                    seen.append(request.opaque)
                    return await handler(conn, request)

                return wrapped

            register.wrap(RequestCode.SEND_MESSAGE_V2, wrap)

    async def main() -> None:
        async with broker_with(tmp_path, plugin_matrix, recorder, Wrapper()) as broker:
            await create_topic(broker)
            responses = await pipelined(broker.address, sends([(0, n, {}) for n in range(6)]))
            assert all(r.code == ResponseCode.SUCCESS for r in responses)
            assert seen == [1, 2, 3, 4, 5, 6]  # the wrapper saw every request
            assert recorder.log.of(TOPIC) == [(0, n, 1) for n in range(6)]

    run(main)


# --------------------------------------------------------------------------- the pieces


def test_the_transport_hands_the_requests_of_one_read_to_handle_many() -> None:
    """The tcp transport knows nothing of sends: it gives a read's requests to ``handle_many``, if
    the handler has one, and awaits one awaitable per request; other handlers see one at a time."""
    from tidemq_transport_tcp import TcpTransport

    class ManyHandler:
        def __init__(self) -> None:
            self.reads: list[list[int]] = []
            self.single: list[int] = []

        async def __call__(self, conn: Any, request: RemotingCommand) -> RemotingCommand:
            self.single.append(request.opaque)
            return request.reply(ResponseCode.SUCCESS, "single")

        def handle_many(self, conn: Any, requests: list[RemotingCommand]) -> list[Any]:
            self.reads.append([r.opaque for r in requests])

            async def answer(request: RemotingCommand, i: int) -> RemotingCommand | None:
                if i == 1:
                    raise RuntimeError("boom")  # answered like a failing handler: SYSTEM_ERROR
                return None if request.is_oneway else request.reply(ResponseCode.SUCCESS, f"many {i}")

            return [answer(r, i) for i, r in enumerate(requests)]

    async def main() -> None:
        handler = ManyHandler()
        server = TcpTransport().server("127.0.0.1", 0, handler)
        await server.start()
        try:
            address = "{}:{}".format(*server.address)
            requests = [RemotingCommand(RequestCode.HEART_BEAT, opaque=i + 1) for i in range(4)]
            responses = await pipelined(address, requests)
            assert handler.reads == [[1, 2, 3, 4]] and handler.single == []
            assert [(r.code, r.remark) for r in responses] == [
                (ResponseCode.SUCCESS, "many 0"),
                (ResponseCode.SYSTEM_ERROR, "RuntimeError: boom"),
                (ResponseCode.SUCCESS, "many 2"),
                (ResponseCode.SUCCESS, "many 3"),
            ]
            (alone,) = await pipelined(address, [RemotingCommand(RequestCode.HEART_BEAT, opaque=9)])
            assert alone.remark == "single" and handler.single == [9]  # one request: the handler
        finally:
            await server.stop()

    asyncio.run(main())


def test_send_fields_reads_v2_names_as_the_renamed_header_did() -> None:
    from tidemq.broker.processors.send import V2_NAMES, send_fields

    def read(code: int, fields: dict[str, str]) -> dict[str, str | None]:
        got, keys = send_fields(RemotingCommand(code, ext_fields=fields))
        return {
            name: got.get(key)
            for name, key in zip(("batch", "producerGroup", "topic"), keys[:3], strict=True)
        }

    short = {"a": "PG", "b": "T", "m": "true"}
    assert read(RequestCode.SEND_MESSAGE_V2, short) == {"batch": "true", "producerGroup": "PG", "topic": "T"}
    assert read(RequestCode.SEND_MESSAGE, short) == read(
        RequestCode.SEND_MESSAGE_V2, short
    )  # 'b', no 'topic'
    # Both names of one field: the later one wins, as when the header was renamed key by key.
    assert read(RequestCode.SEND_MESSAGE_V2, {"topic": "Long", "b": "Short"})["topic"] == "Short"
    assert read(RequestCode.SEND_MESSAGE_V2, {"b": "Short", "topic": "Long"})["topic"] == "Long"
    assert read(RequestCode.SEND_MESSAGE, {"topic": "Long", "b": "Short"})["topic"] == "Long"  # not V2
    assert set(V2_NAMES) == set("abcdefghijklm")
