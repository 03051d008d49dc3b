"""Pull bodies sent with sendfile: the bytes a consumer gets are the stored records, in order.

The broker's pull response is views of the commit log's shared mappings; the tcp transport sends
views of registered mappings with ``os.sendfile`` when its buffer is empty, and hands whatever the
socket does not take to the transport.  These tests use real files, real sockets on loopback and a
real broker, and check the bytes a reader receives, also when the reader stalls mid-response.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import socket
from pathlib import Path

import pytest

from tidemq.file_regions import MIN_SENDFILE_BYTES, file_region, register_mapping
from tidemq.message import BatchItem, Prop, encode_batch, iter_messages, properties_to_string
from tidemq.remoting import FrameDecoder, RemotingCommand
from tidemq.remoting.codec import encode_bytes
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import stringify_fields
from tidemq.testing.pytest_plugin import running_broker
from tidemq_transport_tcp import direct_write
from tidemq_transport_tcp.direct_write import write_direct

pytestmark = pytest.mark.timeout(120)


def _mapped_file(path: Path, data: bytes) -> tuple[int, mmap.mmap]:
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    return fd, mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


def test_file_region_names_the_file_bytes_of_a_registered_mapping(tmp_path: Path) -> None:
    data = os.urandom(256 * 1024)
    fd, mm = _mapped_file(tmp_path / "f", data)
    view = memoryview(mm)
    assert file_region(view[4096:8192]) is None  # not registered yet
    assert register_mapping(mm, fd) and register_mapping(mm, fd)
    os.close(fd)  # the registry holds its own descriptor
    region = file_region(view[5000:70000])
    assert region is not None
    rfd, offset = region
    assert offset == 5000
    assert os.pread(rfd, 65000, offset) == data[5000:70000]
    # Not a registered mapping's bytes: written as usual.
    anon = mmap.mmap(-1, 65536)
    assert file_region(memoryview(anon)[:32768]) is None
    assert file_region(memoryview(data)[:32768]) is None
    assert file_region(view[:32768].toreadonly()) is None
    del view, region
    mm.close()


def _pair(sndbuf: int | None = None) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    if sndbuf is not None:
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, sndbuf)
    a.setblocking(False)
    return a, b


def _read_all(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, "peer closed early"
        out += chunk
    return bytes(out)


def test_write_direct_sends_mixed_chunks_in_order(tmp_path: Path) -> None:
    data = os.urandom(512 * 1024)
    fd, mm = _mapped_file(tmp_path / "f", data)
    register_mapping(mm, fd)
    view = memoryview(mm)
    chunks = [b"head-1", view[100 : 100 + 40000], b"head-2", view[200000:300000], view[10:20], b"tail"]
    expected = b"".join(bytes(c) for c in chunks)
    before = direct_write.counters["sendfile_bytes"]
    a, b = _pair()
    try:
        left = write_direct(a.fileno(), chunks)
        assert left == []
        assert _read_all(b, len(expected)) == expected
    finally:
        a.close()
        b.close()
    assert direct_write.counters["sendfile_bytes"] - before == 140000
    del chunks, view
    mm.close()
    os.close(fd)


def test_write_direct_returns_what_a_full_socket_did_not_take(tmp_path: Path) -> None:
    data = os.urandom(4 * 1024 * 1024)
    fd, mm = _mapped_file(tmp_path / "f", data)
    register_mapping(mm, fd)
    view = memoryview(mm)
    chunks: list[bytes | memoryview] = [b"H" * 10, view[: 2 * 1024 * 1024], b"M" * 7, view[3 * 1024 * 1024 :]]
    expected = b"".join(bytes(c) for c in chunks)
    a, b = _pair(sndbuf=64 * 1024)
    try:
        left = write_direct(a.fileno(), chunks)  # nobody reads yet: the socket fills
        assert left, "a 64 KiB socket buffer took 3 MiB"
        rest = b"".join(bytes(c) for c in left)
        a.setblocking(True)
        got = bytearray()

        def reader() -> None:
            got.extend(_read_all(b, len(expected)))

        import threading

        t = threading.Thread(target=reader)
        t.start()
        a.sendall(rest)
        t.join(30)
        assert bytes(got) == expected
    finally:
        a.close()
        b.close()
    del chunks, left, view
    mm.close()
    os.close(fd)


# ---------------------------------------------------------------------------- through a broker

TOPIC = "SendfilePull"
BATCHES = 128  # of 32 messages of 3000 bytes


def _batch_request(n: int, size: int, seed: int) -> tuple[RemotingCommand, list[bytes]]:
    bodies = [bytes([(seed + i) % 251]) * size for i in range(n)]
    items = [
        BatchItem(
            body,
            0,
            {Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"{seed:08X}{i:024X}", Prop.WAIT_STORE_MSG_OK: "true"},
        )
        for i, body in enumerate(bodies)
    ]
    header = {
        "producerGroup": "pg",
        "topic": TOPIC,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": 1,
        "flag": 0,
        "properties": properties_to_string({Prop.WAIT_STORE_MSG_OK: "true"}),
        "reconsumeTimes": 0,
        "unitMode": False,
        "batch": True,
    }
    return RemotingCommand.request(
        RequestCode.SEND_BATCH_MESSAGE, stringify_fields(header), encode_batch(items)
    ), bodies


def _pull_request(offset: int, count: int) -> RemotingCommand:
    header = {
        "consumerGroup": "sendfile-group",
        "topic": TOPIC,
        "queueId": 0,
        "queueOffset": offset,
        "maxMsgNums": count,
        "sysFlag": 4,  # PULL_FLAG_SUBSCRIPTION: the subscription comes with the request
        "commitOffset": 0,
        "suspendTimeoutMillis": 0,
        "subscription": "*",
        "subVersion": 0,
        "expressionType": "TAG",
    }
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, stringify_fields(header))


async def _responses(reader: asyncio.StreamReader, n: int) -> list[RemotingCommand]:
    decoder = FrameDecoder()
    out: list[RemotingCommand] = []
    while len(out) < n:
        data = await reader.read(1 << 20)
        assert data, "the broker closed the connection"
        out.extend(decoder.feed(data))
    return out


@pytest.mark.parametrize("sendfile", [True, False])
def test_pulled_records_are_the_stored_ones_with_a_stalling_reader(tmp_path: Path, sendfile: bool) -> None:
    """Pipelined pulls of 64 KiB+ bodies, read only after a pause (the socket fills, the transport
    buffers the rest): every response whole, in order, each record the one that was sent."""

    async def main() -> None:
        async with running_broker(
            tmp_path / "broker", options={"transport": {"tcp": {"sendfile": sendfile}}}
        ) as broker:
            host, port = broker.address.rsplit(":", 1)
            # A small receive window (set before connecting) and 12 MiB of responses: more than
            # the broker's socket can hold, so part of them waits in its transport.
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
            sock.connect((host, int(port)))
            sock.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=sock)
            sent: list[bytes] = []
            for seed in range(BATCHES):
                request, bodies = _batch_request(32, 3000, seed)
                writer.write(encode_bytes(request))
                sent.extend(bodies)
            for resp in await _responses(reader, BATCHES):
                assert resp.code == ResponseCode.SUCCESS, resp.remark
            before = direct_write.counters["sendfile_bytes"]
            handed_back = direct_write.counters["handed_back"]
            pulls = [_pull_request(offset, 32) for offset in range(0, len(sent), 32)]
            writer.write(b"".join(encode_bytes(p) for p in pulls))
            await writer.drain()
            await asyncio.sleep(0.5)  # do not read: the broker's socket buffer fills
            responses = await _responses(reader, len(pulls))
            writer.close()
            got: list[bytes] = []
            by_opaque = {r.opaque: r for r in responses}
            for pull in pulls:
                resp = by_opaque[pull.opaque]
                assert resp.code == ResponseCode.SUCCESS, resp.remark
                got.extend(m.body for m in iter_messages(resp.payload(), check_crc=True))
            assert got == sent
            used = direct_write.counters["sendfile_bytes"] - before
            if sendfile:
                assert used >= MIN_SENDFILE_BYTES
                # The stall made the socket refuse part of a response: the rest went by the transport.
                assert direct_write.counters["handed_back"] > handed_back
            else:
                assert used == 0

    asyncio.run(main())
