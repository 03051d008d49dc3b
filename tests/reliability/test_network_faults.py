"""Network faults against a live broker process: it stays up, memory stays bounded, others proceed.

Each test measures the broker's RSS (/proc/<pid>/status) around the fault and asserts a stated
bound, and checks that a well-formed request on a fresh connection is answered afterwards.  The
bounds are generous on purpose: they catch unbounded buffering (hundreds of MiB), not noise.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import random
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.client import BlockingProducer, Message, SendStatus
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codes import FLAG_ONEWAY, RequestCode, ResponseCode, SerializeType

from .cluster import Cluster, assert_broker_serves, assert_log_clean, faults_cluster, report, rss_kib
from .rawclient import RawConn, pull_fields, raise_nofile

MAX_FRAME = 1024 * 1024  # the broker under test refuses frames over 1 MiB
TOPIC = "NetTopic"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = faults_cluster(
        tmp_path_factory.mktemp("net"),
        broker={"max_frame_size": MAX_FRAME},
        transport={"max_frame_size": MAX_FRAME},
    )
    with BlockingProducer("net-seed", c.namesrv.address) as p:
        body = os.urandom(8 * 1024)
        # ~8 MiB to pull: enough that a consumer that does not read fills every buffer on the way.
        futs = [p.send_async(Message(TOPIC, body, tags="A")) for _ in range(1000)]
        assert all(f.result(30).status is SendStatus.SEND_OK for f in futs)
    yield c
    c.close()


def pull_request(queue_id: int, offset: int = 0, group: str = "slow-cg") -> RemotingCommand:
    return RemotingCommand.request(
        RequestCode.PULL_MESSAGE, pull_fields(TOPIC, group=group, queue_id=queue_id, offset=offset)
    )


class SendMeter:
    """Another client's sends: how many complete per second while a fault is going on."""

    def __init__(self, cluster: Cluster) -> None:
        self.producer = BlockingProducer(f"meter-{time.monotonic_ns()}", cluster.namesrv.address)
        self.producer.start()
        self.producer.send(Message(TOPIC, b"warm"))

    def rate(self, n: int, timeout: float = 60.0) -> float:
        """Send ``n`` messages 16 at a time; all must succeed within ``timeout``. Returns msgs/s."""
        t0 = time.monotonic()
        done = 0
        while done < n:
            futs = [self.producer.send_async(Message(TOPIC, b"m" * 200)) for _ in range(min(16, n - done))]
            for f in futs:
                assert f.result(max(1.0, timeout - (time.monotonic() - t0))).status is SendStatus.SEND_OK
            done += len(futs)
        return n / (time.monotonic() - t0)

    def close(self) -> None:
        self.producer.shutdown()


def test_slow_consumer_is_bounded_and_does_not_stall_others(cluster: Cluster) -> None:
    pid = cluster.broker.pid
    meter = SendMeter(cluster)
    try:
        before = meter.rate(400)
        rss0 = rss_kib(pid)
        slow = []
        for _ in range(4):
            conn = RawConn(cluster.broker_address)
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            slow.append(conn)

        def flood(conn: RawConn) -> int:
            # Pull requests for ~256 KiB each, 2000 of them, never reading a byte of the answers.
            sent = 0
            conn.sock.settimeout(0.5)
            try:
                for i in range(2000):
                    conn.send_cmd(pull_request(i % 4, (i * 32) % 200))
                    sent += 1
            except OSError:  # the broker stopped reading us: that is the back-pressure
                pass
            return sent

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            floods = [pool.submit(flood, c) for c in slow]
            time.sleep(1.0)
            during = meter.rate(400)
            sent = sum(f.result(60) for f in floods)
        rss1 = rss_kib(pid)
        report(
            "slow-consumer",
            slow_connections=len(slow),
            pull_requests_sent=sent,
            sends_per_s_before=round(before),
            sends_per_s_during=round(during),
            ratio=round(during / before, 2),
            rss_before_kib=rss0,
            rss_during_kib=rss1,
        )
        # Four connections x (4 MiB write high-water + socket buffers + held requests): far below this.
        assert rss1 - rss0 < 128 * 1024
        # The meter's sends all completed within their timeout while the flood was served (rate()
        # asserts it): the broker shares its 2 cores with the flood, it does not stall others.
        assert during > 0
        for c in slow:
            c.close()
        assert_broker_serves(cluster)
    finally:
        meter.close()


def _proc_address(address: tuple[str, int]) -> str:
    """``(host, port)`` of an IPv4 socket as /proc/net/tcp writes it (the address little-endian)."""
    host, port = address[0], address[1]
    return f"{int.from_bytes(socket.inet_aton(host), 'little'):08X}:{port:04X}"


def accepted_from(pid: int, server: str, clients: list[RawConn]) -> int:
    """How many of ``clients`` process ``pid`` has accepted on ``server`` (host:port): its sockets
    (by inode) whose ESTABLISHED row joins that address to a client's.  A connection still in the
    kernel's backlog has no socket in the process yet; sockets the process opens or closes
    meanwhile for anything else (the NameServer, the last test's clients going away) do not count."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed while listed
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    host, port = server.rsplit(":", 1)
    local = _proc_address((host, int(port)))
    peers = {_proc_address(c.sock.getsockname()) for c in clients}
    accepted = set()  # the kernel lists a row twice when sockets come and go during the read
    with open(f"/proc/{pid}/net/tcp") as f:
        next(f)
        for row in f:
            # sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
            fields = row.split()
            if fields[1] == local and fields[3] == "01" and fields[9] in inodes and fields[2] in peers:
                accepted.add(fields[9])
    return len(accepted)


def test_a_thousand_idle_connections_cost_bounded_memory(cluster: Cluster) -> None:
    raise_nofile(1200 + 256)
    pid = cluster.broker.pid
    rss0 = rss_kib(pid)
    conns = []
    try:
        for _ in range(1000):
            conns.append(RawConn(cluster.broker_address))
        # The broker really accepted them (not just the kernel's backlog): a socket of its own for
        # each; under load the last accepts come a while after connect() returned.  Only then is
        # its memory measured.
        deadline = time.monotonic() + 60
        while (accepted := accepted_from(pid, cluster.broker_address, conns)) < 1000:
            assert time.monotonic() < deadline, f"the broker accepted {accepted} of 1000 connections"
            time.sleep(0.1)
        assert accepted == 1000
        rss1 = rss_kib(pid)
        meter = SendMeter(cluster)
        try:
            rate = meter.rate(200)
        finally:
            meter.close()
        assert_broker_serves(cluster)
        report(
            "idle-1000",
            connections=len(conns),
            rss_before_kib=rss0,
            rss_after_kib=rss1,
            sends_per_s=round(rate),
        )
        assert rss1 - rss0 < 64 * 1024  # < 64 KiB per idle connection
    finally:
        for c in conns:
            c.close()


def test_half_written_frames_and_silent_clients_do_not_block_others(cluster: Cluster) -> None:
    pid = cluster.broker.pid
    rss0 = rss_kib(pid)
    conns = []
    try:
        for i in range(200):
            c = RawConn(cluster.broker_address)
            if i % 2:  # half a frame: a length that promises more than ever comes
                c.send(struct.pack(">I", 4000) + b"\x00\x00\x00\x10{" + b"x" * (i % 50))
            conns.append(c)  # the even ones never send at all
        assert_broker_serves(cluster)
        meter = SendMeter(cluster)
        try:
            meter.rate(200)
        finally:
            meter.close()
        rss1 = rss_kib(pid)
        report("half-frames", connections=len(conns), rss_before_kib=rss0, rss_after_kib=rss1)
        assert rss1 - rss0 < 64 * 1024
    finally:
        for c in conns:
            c.close()


def test_frames_over_the_size_limit_close_only_that_connection(cluster: Cluster) -> None:
    rss0 = rss_kib(cluster.broker.pid)
    bystander = RawConn(cluster.broker_address)
    try:
        for length in (MAX_FRAME + 1, 0x7FFFFFFF, 0xFFFFFFFF):
            c = RawConn(cluster.broker_address)
            c.send(struct.pack(">I", length) + b"\x00\x00\x00\x02{}")
            assert c.closed(10), f"a {length}-byte frame was not refused"
            c.close()
        # A body just over the limit, really sent: refused before it is buffered.
        c = RawConn(cluster.broker_address)
        try:
            c.send(struct.pack(">II", MAX_FRAME + 64, 2) + b"{}" + b"\0" * (MAX_FRAME + 64))
        except OSError:
            pass  # closed while we were still writing: that is the refusal
        assert c.closed(10)
        c.close()
        resp = bystander.call(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
        assert resp is not None and resp.code == ResponseCode.SUCCESS
        assert rss_kib(cluster.broker.pid) - rss0 < 64 * 1024
        assert "closing connection" in cluster.broker.log_text()  # reported
    finally:
        bystander.close()


def test_random_bytes_on_many_connections(cluster: Cluster) -> None:
    rng = random.Random(1234)
    rss0 = rss_kib(cluster.broker.pid)
    closed = 0
    for _ in range(100):
        c = RawConn(cluster.broker_address)
        try:
            c.send(rng.randbytes(rng.randint(1, 20000)))
            closed += c.closed(0.2)
        except OSError:
            closed += 1
        finally:
            c.close()
    assert_broker_serves(cluster)
    report(
        "random-bytes",
        connections=100,
        closed_by_broker=closed,
        rss_delta_kib=rss_kib(cluster.broker.pid) - rss0,
    )
    assert rss_kib(cluster.broker.pid) - rss0 < 64 * 1024


# ---------------------------------------------------------------------------- processor fuzz

_FIELDS = (
    "topic queueId queueOffset maxMsgNums consumerGroup producerGroup sysFlag bornTimestamp flag "
    "properties commitOffset suspendTimeoutMillis subscription subVersion expressionType key maxNum "
    "beginTimestamp endTimestamp offset group clientID commitLogOffset timestamp perm readQueueNums "
    "writeQueueNums defaultTopic defaultTopicQueueNums reconsumeTimes delayLevel originMsgId "
    "transactionId tranStateTableOffset commitOrRollback batch order maxReconsumeTimes unitMode "
    "_UNIQUE_KEY_QUERY"
).split()
# Codes that would stop the fuzz from testing anything: deleting the topic the final check uses.
_AVOID = {RequestCode.DELETE_TOPIC_IN_BROKER} if hasattr(RequestCode, "DELETE_TOPIC_IN_BROKER") else set()

_KNOWN = {int(c) for c in RequestCode}

_values = st.one_of(
    st.text(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str),
    st.sampled_from(["", "0", "-1", "1", "*", TOPIC, "TBW102", "%RETRY%x", "true", "false", "2147483648"]),
)
_requests = st.fixed_dictionaries(
    {
        "code": st.one_of(
            st.sampled_from([c for c in RequestCode if c not in _AVOID]),
            st.integers(min_value=-32768, max_value=32767),
        ),
        "fields": st.dictionaries(
            st.one_of(st.sampled_from(_FIELDS), st.text(max_size=10)), _values, max_size=12
        ),
        "body": st.one_of(
            st.none(), st.binary(max_size=2048), st.sampled_from([b"{}", b"[]", b"null", b'{"a":1}'])
        ),
        "binary_header": st.booleans(),
        "oneway": st.booleans(),
        "version": st.integers(min_value=-32768, max_value=32767),
    }
)


class FuzzPeer:
    def __init__(self, address: str) -> None:
        self.address = address
        self.conn = RawConn(address)
        self.requests = 0
        self.answered = 0
        self.closed = 0
        self.unanswered: list[str] = []  # two-way requests (not held pulls) the broker never answered
        self.bad: list[str] = []  # answers that break the oracle of _judge
        self.answer_codes: dict[int, int] = {}

    def send(self, req: dict) -> None:
        cmd = RemotingCommand.request(
            req["code"],
            None,
            req["body"],
            serialize_type=SerializeType.ROCKETMQ if req["binary_header"] else SerializeType.JSON,
        )
        cmd.ext_fields = dict(req["fields"])
        cmd.version = req["version"]
        if req["oneway"]:
            cmd.flag |= FLAG_ONEWAY
        self.requests += 1
        held = req["code"] == RequestCode.PULL_MESSAGE
        try:
            self.conn.send_cmd(cmd)
            if not req["oneway"]:
                # Held pulls answer later: do not wait for them, only for the others.
                resp = self._answer_to(cmd.opaque, 0.5 if held else 5.0)
                if resp is not None:
                    self.answered += 1
                    self._judge(req, resp)
                elif not held and not self.conn.closed_by_peer:
                    self.unanswered.append(f"code {req['code']} fields {req['fields']!r}"[:300])
        except OSError:
            self.conn.closed_by_peer = True
        except Exception:  # an unencodable random command is the fuzzer's problem, not the broker's
            return
        if self.conn.closed_by_peer:
            self.closed += 1
            self.conn.close()
            self.conn = RawConn(self.address)

    def _answer_to(self, opaque: int, timeout: float) -> RemotingCommand | None:
        """The response to request ``opaque`` (a held pull's late answer is passed over)."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            resp = self.conn.recv_cmd(left)
            if resp is None or resp.opaque == opaque:
                return resp
        return None

    def _judge(self, req: dict, resp: RemotingCommand) -> None:
        """An answer is a response, names an unknown code as such, and says why it refuses."""
        if not resp.is_response:
            self.bad.append(f"code {req['code']}: answered with a request")
        elif req["code"] not in _KNOWN and resp.code != ResponseCode.REQUEST_CODE_NOT_SUPPORTED:
            self.bad.append(f"unknown code {req['code']} answered {resp.code} {resp.remark!r}")
        elif resp.code == ResponseCode.SYSTEM_ERROR and not resp.remark:
            self.bad.append(f"code {req['code']}: SYSTEM_ERROR without a remark")
        self.answer_codes[resp.code] = self.answer_codes.get(resp.code, 0) + 1


def run_processor_fuzz(cluster: Cluster, examples: int) -> dict:
    peer = FuzzPeer(cluster.broker_address)
    rss0 = rss_kib(cluster.broker.pid)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(_requests)
    def fuzz(req: dict) -> None:
        peer.send(req)
        assert cluster.broker.alive(), cluster.broker.log_text()[-3000:]

    try:
        fuzz()
    finally:
        peer.conn.close()
    assert_broker_serves(cluster)
    with BlockingProducer("after-fuzz", cluster.namesrv.address) as p:
        assert p.send(Message(TOPIC, b"after fuzz")).status is SendStatus.SEND_OK
    figures = {
        "requests": peer.requests,
        "answered": peer.answered,
        "unanswered": len(peer.unanswered),
        "connections_closed_by_broker": peer.closed,
        "answer_codes": dict(sorted(peer.answer_codes.items())),
        "rss_before_kib": rss0,
        "rss_after_kib": rss_kib(cluster.broker.pid),
    }
    # Every two-way request (but a held pull) gets its own answer: the broker never drops one.
    assert peer.unanswered == [], peer.unanswered[:10]
    assert peer.bad == [], peer.bad[:10]
    assert figures["rss_after_kib"] - rss0 < 128 * 1024
    return figures


def test_fuzzed_requests_to_every_processor(cluster: Cluster) -> None:
    report("processor-fuzz", **run_processor_fuzz(cluster, 400))


@pytest.mark.slow
def test_fuzzed_requests_to_every_processor_long(cluster: Cluster) -> None:
    report("processor-fuzz-long", **run_processor_fuzz(cluster, 5000))


def test_broker_log_has_no_unhandled_errors(cluster: Cluster) -> None:
    """Bad input is refused with a one-line reason; nothing reaches the loop's crash handler.

    After the module's other tests, or alone (``-k``, xdist): a short fuzz of its own first, so the
    log always holds hostile requests to check."""
    run_processor_fuzz(cluster, 40)
    assert_log_clean(cluster)
