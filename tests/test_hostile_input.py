"""Issue 20: requests and files a hostile or careless peer sends must never damage stored data.

Each test here reproduces one defect against a real broker (in-process, real sockets, real
files) or a real NameServer, and asserts what a user relies on once it is fixed.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import lz4.frame
import orjson
import pytest
import zstandard
from conftest import free_port
from test_broker_processors import call, pull_fields, running, send_fields
from test_namesrv_routes import with_namesrv

from tidemq.compression import (
    DecompressionLimitError,
    decompress,
    inflate_lz4_frame,
    inflate_zlib,
    inflate_zstd,
)
from tidemq.datadir import DataDirInUseError, holder, lock_data_dir
from tidemq.jsonfile import CoalescedJsonWriter
from tidemq.message import (
    COMPRESSED_FLAG,
    COMPRESSION_LZ4,
    COMPRESSION_ZSTD,
    BatchItem,
    encode_batch,
    iter_messages,
)
from tidemq.names import InvalidNameError, check_group_name, check_topic_name, topic_dir
from tidemq.namesrv import NameServer
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq_transport_tcp import TcpTransport

pytestmark = pytest.mark.timeout(90)

RC = RequestCode


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name",
    ["Topic\n", "a/b", "..", "x/../Victim", "../../etc", "a b", "é", "a\x00b", "", "T" * 128],
)
def test_topic_names_are_checked_with_a_full_match(name: str) -> None:
    assert check_topic_name(name) is not None


def test_valid_names_pass_and_group_length_is_rocketmq_s() -> None:
    for name in ("TopicTest", "%RETRY%group_1", "a|b", "x-y_z", "T" * 127):
        assert check_topic_name(name) is None
    assert check_group_name("G" * 255) is None and check_group_name("G" * 256) is not None
    assert check_group_name("group\n") is not None


def test_store_refuses_names_that_leave_its_directory(tmp_path: Path) -> None:
    for bad in ("../x", "a/../../b", "..", "x\n"):
        with pytest.raises(InvalidNameError):
            topic_dir(tmp_path, bad)
    assert topic_dir(tmp_path, "Good") == tmp_path / "Good"


def _victim_bodies(resp: RemotingCommand) -> list[bytes]:
    assert resp.code == ResponseCode.SUCCESS, resp.remark
    return [m.body for m in iter_messages(resp.payload())]


def test_send_back_with_a_path_group_leaves_other_topics_and_the_disk_alone(tmp_path: Path) -> None:
    """The critical defect: group ``x/../Victim`` wrote into Victim's consume queue."""
    data = tmp_path / "data"
    data.mkdir()
    before_outside = set(tmp_path.iterdir())

    async def main() -> None:
        async with running(data, {}) as (broker, client):
            offsets = []
            for i in range(5):
                r = await call(client, broker, RC.SEND_MESSAGE, send_fields("Victim", 0), f"m{i}".encode())
                assert r.code == ResponseCode.SUCCESS, r.remark
                offsets.append(r)
            pulled = await call(client, broker, RC.PULL_MESSAGE, pull_fields("Victim", 0, 0))
            first = next(iter_messages(pulled.payload()))
            for group in ("x/../Victim", "../../../../outside", "Victim\n", "a" * 300):
                r = await call(
                    client,
                    broker,
                    RC.CONSUMER_SEND_MSG_BACK,
                    {"group": group, "offset": first.commit_log_offset, "delayLevel": -1},
                )
                assert r.code == ResponseCode.SYSTEM_ERROR and "group name" in (r.remark or ""), r.remark
            resp = await call(client, broker, RC.PULL_MESSAGE, pull_fields("Victim", 0, 0))
            assert _victim_bodies(resp) == [f"m{i}".encode() for i in range(5)]
        async with running(data, {}) as (broker, client):  # after a restart too
            resp = await call(client, broker, RC.PULL_MESSAGE, pull_fields("Victim", 0, 0))
            assert _victim_bodies(resp) == [f"m{i}".encode() for i in range(5)]

    asyncio.run(main())
    assert set(tmp_path.iterdir()) == before_outside  # nothing created next to the data dir
    cq_dirs = sorted(p.name for p in (data / "consumequeue").iterdir())
    assert all(check_topic_name(n) is None or n.startswith("%") for n in cq_dirs), cq_dirs
    assert not any(n.startswith(("%RETRY%x", "%DLQ%x", "%DLQ%.")) for n in cq_dirs)


def test_delete_topic_with_a_path_name_removes_nothing_outside(tmp_path: Path) -> None:
    data = tmp_path / "data"
    outside = tmp_path / "precious"
    outside.mkdir()

    async def main() -> None:
        async with running(data, {}) as (broker, client):
            for topic in ("../../precious", "../precious", "a/../../../precious"):
                r = await call(client, broker, RC.DELETE_TOPIC_IN_BROKER, {"topic": topic})
                assert r.code == ResponseCode.SYSTEM_ERROR and "topic name" in (r.remark or "")

    asyncio.run(main())
    assert outside.is_dir()


def test_send_to_a_topic_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}) as (broker, client):
            r = await call(client, broker, RC.SEND_MESSAGE, send_fields("Orders\n", 0), b"x")
            assert r.code == ResponseCode.SYSTEM_ERROR and "characters other than" in (r.remark or "")
            assert broker.topics.get("Orders\n") is None

    asyncio.run(main())


def test_heartbeat_with_bad_entries_gets_a_clear_error_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bodies = [
        ({"clientID": "c", "consumerDataSet": ["not an object"]}, "consumerDataSet[0] is a str"),
        ({"clientID": "c", "consumerDataSet": {"groupName": "G"}}, "consumerDataSet is a dict"),
        ({"clientID": "c", "consumerDataSet": [{"groupName": "x/../G"}]}, "group name"),
        ({"clientID": "c", "producerDataSet": [1]}, "producerDataSet[0] is a int"),
        (
            {"clientID": "c", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": ["t"]}]},
            "subscriptionDataSet[0] is a str",
        ),
        (
            {
                "clientID": "c",
                "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": [{"topic": "../x"}]}],
            },
            "topic name",
        ),
        ([1, 2], "not an object"),
    ]

    async def main() -> None:
        async with running(tmp_path, {}) as (broker, client):
            for body, expected in bodies:
                r = await call(client, broker, RC.HEART_BEAT, {}, orjson.dumps(body))
                assert r.code == ResponseCode.SYSTEM_ERROR, (body, r.remark)
                assert expected in (r.remark or "") and "Error:" not in (r.remark or ""), r.remark
            assert broker.groups.get("G") is None and broker.consumers.get("G") is None
            ok = {"clientID": "c", "consumerDataSet": [{"groupName": "G", "subscriptionDataSet": []}]}
            assert (await call(client, broker, RC.HEART_BEAT, {}, orjson.dumps(ok))).code == 0

    caplog.set_level("INFO")
    asyncio.run(main())
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"


def test_names_found_on_disk_are_checked_at_load(tmp_path: Path) -> None:
    """A topic or group from a file (hand-edited, or left by an older version) never becomes a path."""
    config = tmp_path / "config"
    config.mkdir(parents=True)
    (config / "topics.json").write_bytes(
        orjson.dumps({"topicConfigTable": {"../../evil": {"readQueueNums": 1, "writeQueueNums": 1}}})
    )
    (config / "subscriptionGroup.json").write_bytes(
        orjson.dumps({"subscriptionGroupTable": {"x/../y": {"groupName": "x/../y"}}})
    )
    (config / "consumerOffset.json").write_bytes(orjson.dumps({"offsetTable": {"../t@g": {"0": 1}}}))

    async def main() -> None:
        async with running(tmp_path, {}) as (broker, _client):
            assert broker.topics.get("../../evil") is None
            assert broker.groups.get("x/../y") is None
            assert broker.offsets.query("g", "../t", 0) == -1

    asyncio.run(main())


# --------------------------------------------------------------------------- the NameServer


def _register(topics: dict[str, int], *, compressed_body: bytes | None = None) -> RemotingCommand:
    from tidemq.remoting.protocol import (
        DataVersion,
        RegisterBrokerBody,
        TopicConfig,
        TopicConfigSerializeWrapper,
    )

    table = {t: TopicConfig(t, n, n) for t, n in topics.items()}
    raw = RegisterBrokerBody(TopicConfigSerializeWrapper(table, DataVersion(1, 1))).encode()
    fields: dict[str, Any] = {
        "brokerName": "broker-a",
        "brokerAddr": "127.0.0.1:10911",
        "clusterName": "DefaultCluster",
        "brokerId": 0,
    }
    if compressed_body is not None:
        raw = compressed_body
        fields["compressed"] = "true"
    return RemotingCommand.request(RC.REGISTER_BROKER, fields, raw)


def test_namesrv_refuses_registrations_naming_invalid_topics() -> None:
    async def body(ns: NameServer, client: Any, addr: str) -> None:
        r = await client.invoke(addr, _register({"Good": 4, "../evil": 4}), 3)
        assert r.code == ResponseCode.SYSTEM_ERROR and "../evil" in (r.remark or "")
        assert "Good" not in ns.route_info.topic_queue_table
        assert (await client.invoke(addr, _register({"Good": 4}), 3)).code == ResponseCode.SUCCESS

    with_namesrv(body)


def test_namesrv_refuses_a_compressed_register_body_that_inflates_past_the_frame_limit() -> None:
    bomb = zlib.compress(bytes(64 << 20), 9)  # 64 KiB on the wire, 64 MiB inflated

    async def body(ns: NameServer, client: Any, addr: str) -> None:
        r = await client.invoke(addr, _register({}, compressed_body=bomb), 10)
        assert r.code == ResponseCode.SYSTEM_ERROR and "inflates to more than" in (r.remark or ""), r.remark
        assert (await client.invoke(addr, _register({"T": 1}), 3)).code == ResponseCode.SUCCESS

    with_namesrv(body, max_frame_size=1 << 20)


# --------------------------------------------------------------------------- decompression


@pytest.mark.parametrize(
    "make",
    [
        lambda raw: zlib.compress(raw, 9),
        lambda raw: lz4.frame.compress(raw),
        lambda raw: zstandard.ZstdCompressor().compress(raw),  # content size in the header
        lambda raw: (lambda c: c.compress(raw) + c.flush())(zstandard.ZstdCompressor().compressobj()),
    ],
    ids=["zlib", "lz4", "zstd-sized", "zstd-streamed"],
)
def test_every_inflate_stops_at_its_limit(make: Any) -> None:
    bomb = make(bytes(32 << 20))
    inflate = {0: inflate_zlib, 1: inflate_lz4_frame, 2: inflate_zstd, 3: inflate_zstd}
    for fn in set(inflate.values()):
        try:
            fn(bomb, 1 << 20)
        except DecompressionLimitError:
            break  # the matching codec refused it
        except Exception:
            continue  # another codec's error: not this one's format
    else:
        pytest.fail("no inflate function refused the bomb")
    small = make(b"hello" * 100)
    assert any(_inflates(fn, small) == b"hello" * 100 for fn in set(inflate.values()))


def _inflates(fn: Any, data: bytes) -> bytes | None:
    try:
        return fn(data, 1 << 20)
    except Exception:
        return None


def test_consumers_do_not_inflate_message_bodies_past_the_limit() -> None:
    raw = bytes(32 << 20)
    for flag, data in (
        (COMPRESSED_FLAG, zlib.compress(raw, 9)),
        (COMPRESSED_FLAG | COMPRESSION_LZ4, lz4.frame.compress(raw)),
        (COMPRESSED_FLAG | COMPRESSION_ZSTD, zstandard.ZstdCompressor().compress(raw)),
    ):
        with pytest.raises(DecompressionLimitError):
            decompress(data, flag, 16 << 20)
        assert decompress(data, flag, 64 << 20) == raw


# --------------------------------------------------------------------------- one process per data dir


def test_a_second_process_on_a_live_data_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    other_port = free_port()

    async def main() -> None:
        async with running(data, {}) as (broker, client):
            proc = await asyncio.to_thread(
                subprocess.run,
                [
                    sys.executable,
                    "-m",
                    "tidemq",
                    "broker",
                    "--data-dir",
                    str(data),
                    "--listen",
                    f"127.0.0.1:{other_port}",
                    "--namesrv",
                    "127.0.0.1:1",
                ],
                capture_output=True,
                timeout=60,
            )
            err = proc.stderr.decode()
            assert proc.returncode == 2, err[-2000:]
            assert f"data directory {data} is in use by pid {os.getpid()}" in err, err[-2000:]
            # The live broker kept its abort marker and still serves.
            assert (data / "abort").exists()
            r = await call(client, broker, RC.SEND_MESSAGE, send_fields("StillHere", 0), b"x")
            assert r.code == ResponseCode.SUCCESS
            assert holder(data) is not None
        assert holder(data) is None  # released at stop

    asyncio.run(main())


def test_the_lock_dies_with_its_process(tmp_path: Path) -> None:
    """flock is released by the kernel: a SIGKILLed broker leaves no stale lock behind."""
    code = (
        "import sys, time; from tidemq.datadir import lock_data_dir; "
        f"lock_data_dir({str(tmp_path)!r}, 'test holder'); print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"held"
        with pytest.raises(DataDirInUseError, match=rf"pid {proc.pid} \(test holder\)"):
            lock_data_dir(tmp_path)
        assert holder(tmp_path) == f"pid {proc.pid} (test holder)"
    finally:
        proc.kill()
        proc.wait()
    with lock_data_dir(tmp_path):
        pass


def test_store_verify_on_a_live_store_says_so(tmp_path: Path) -> None:
    data = tmp_path / "data"

    async def main() -> None:
        async with running(data, {}) as (broker, client):
            r = await call(client, broker, RC.SEND_MESSAGE, send_fields("V", 0), b"x")
            assert r.code == ResponseCode.SUCCESS
            proc = await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "tidemq", "store", "verify", str(data)],
                capture_output=True,
                timeout=60,
            )
            assert f"is live (in use by pid {os.getpid()}" in proc.stderr.decode(), proc.stderr.decode()

    asyncio.run(main())


# --------------------------------------------------------------------------- held pulls


def test_held_pulls_are_released_when_their_connection_closes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}) as (broker, _client):
            r = await call(_client, broker, RC.SEND_MESSAGE, send_fields("Held", 0), b"x")
            assert r.code == ResponseCode.SUCCESS
            holder_client = TcpTransport().client()
            conn = await holder_client.connection(broker.address)
            for i in range(50):
                req = RemotingCommand.request(
                    RC.PULL_MESSAGE, pull_fields("Held", 0, 1, group=f"g{i % 3}", suspend_ms=60_000)
                )
                asyncio.ensure_future(conn.invoke(req, 120)).add_done_callback(lambda f: f.exception())
            deadline = time.monotonic() + 5
            while broker.hold.waiting < 50 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert broker.hold.waiting == 50
            await holder_client.close()
            deadline = time.monotonic() + 5
            while broker.hold.waiting and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert broker.hold.waiting == 0
            assert all(c.in_flight == 0 for c in broker._server.connections)

    asyncio.run(main())


def test_suspend_time_is_capped_and_held_pulls_per_connection_are_bounded(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}, max_suspend_ms=300, max_held_pulls_per_connection=4) as (
            broker,
            client,
        ):
            r = await call(client, broker, RC.SEND_MESSAGE, send_fields("Cap", 0), b"x")
            assert r.code == ResponseCode.SUCCESS
            started = time.monotonic()
            resp = await call(
                client, broker, RC.PULL_MESSAGE, pull_fields("Cap", 0, 1, suspend_ms=10**9), timeout=10
            )
            assert resp.code == ResponseCode.PULL_NOT_FOUND and time.monotonic() - started < 5
            conn = await client.connection(broker.address)
            pulls = [
                asyncio.ensure_future(
                    conn.invoke(
                        RemotingCommand.request(RC.PULL_MESSAGE, pull_fields("Cap", 0, 1, suspend_ms=300)), 10
                    )
                )
                for _ in range(6)
            ]
            answers = await asyncio.gather(*pulls)
            codes = sorted(a.code for a in answers)
            assert codes.count(ResponseCode.SYSTEM_BUSY) == 2, [(a.code, a.remark) for a in answers]
            assert codes.count(ResponseCode.PULL_NOT_FOUND) == 4

    asyncio.run(main())


# --------------------------------------------------------------------------- batches and metadata


def test_a_batch_over_the_message_limit_is_refused_clearly(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}, max_batch_messages=100) as (broker, client):
            fields = send_fields("Batch", 0)
            body = encode_batch([BatchItem(b"x", 0, {}) for _ in range(101)])
            r = await call(client, broker, RC.SEND_BATCH_MESSAGE, fields, body)
            assert r.code == ResponseCode.MESSAGE_ILLEGAL and "more than 100 messages" in (r.remark or "")
            assert broker.store.get_max_offset_in_queue("Batch", 0) == 0
            body = encode_batch([BatchItem(b"x", 0, {}) for _ in range(100)])
            r = await call(client, broker, RC.SEND_BATCH_MESSAGE, fields, body)
            assert r.code == ResponseCode.SUCCESS, r.remark

    asyncio.run(main())


def test_metadata_changes_are_written_coalesced_off_the_caller(tmp_path: Path) -> None:
    path = tmp_path / "table.json"
    table: dict[str, int] = {}
    snapshots = 0

    def snapshot() -> dict[str, int]:
        nonlocal snapshots
        snapshots += 1
        return dict(table)

    writer = CoalescedJsonWriter(path, snapshot)
    for i in range(2000):
        table[f"g{i}"] = i
        writer.request()
    deadline = time.monotonic() + 5
    while writer.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert orjson.loads(path.read_bytes()) == table  # all of it on disk, within moments
    assert snapshots < 50  # 2 000 changes, a handful of writes
    writer.close()


def test_auto_created_groups_reach_the_file(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}) as (broker, client):
            r = await call(client, broker, RC.SEND_MESSAGE, send_fields("G", 0), b"x")
            assert r.code == ResponseCode.SUCCESS
            for i in range(300):
                resp = await call(client, broker, RC.PULL_MESSAGE, pull_fields("G", 0, 0, group=f"auto-{i}"))
                assert resp.code == ResponseCode.SUCCESS
            deadline = time.monotonic() + 5
            path = tmp_path / "config" / "subscriptionGroup.json"
            while time.monotonic() < deadline:
                if path.exists() and len(orjson.loads(path.read_bytes())["subscriptionGroupTable"]) >= 300:
                    break
                await asyncio.sleep(0.05)
            assert len(orjson.loads(path.read_bytes())["subscriptionGroupTable"]) >= 300

    asyncio.run(main())


def test_a_broadcasting_consumer_s_group_never_becomes_a_path_outside_its_directory(tmp_path: Path) -> None:
    from tidemq.client.offset_store import LocalFileOffsetStore

    with pytest.raises(InvalidNameError):
        LocalFileOffsetStore(tmp_path, "instance", "../../escape")
    assert (
        LocalFileOffsetStore(tmp_path, "instance", "G").path == tmp_path / "instance" / "G" / "offsets.json"
    )
