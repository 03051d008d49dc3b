"""Hostile requests against a live broker process (issue 20): names, data dirs, bombs, floods.

One class per defect of the issue.  Every class runs its hostile input while a producer sends
acknowledged messages, then checks that the broker is alive, that it still answers, and that
every acknowledged message is served at its offset (acknowledged lost = 0), and prints its figures
as a ``RELIABILITY`` line (``pytest -s``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.client import BlockingProducer, BlockingPullConsumer, Message, SendStatus
from tidemq.message import BatchItem, encode_batch
from tidemq.names import check_group_name, check_stored_topic_name
from tidemq.queues import MessageQueue
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codes import FLAG_RESPONSE, RequestCode, ResponseCode
from tidemq.remoting.protocol import DataVersion, RegisterBrokerBody, TopicConfig, TopicConfigSerializeWrapper

from .cluster import (
    Cluster,
    assert_broker_serves,
    assert_log_clean,
    faults_cluster,
    free_port,
    report,
    rss_kib,
)
from .rawclient import RawConn, pull_fields, raise_nofile, runtime_info

RC = RequestCode
VICTIM = "Victim"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = faults_cluster(
        tmp_path_factory.mktemp("hostile"),
        commitlog_file_size=4 * 1024 * 1024,
        broker={"max_held_pulls_per_connection": 200, "max_batch_messages": 4096},
    )
    yield c
    c.close()


class Acked:
    """A producer that remembers what the broker acknowledged, per queue offset."""

    def __init__(self, cluster: Cluster, topic: str = VICTIM) -> None:
        self.cluster = cluster
        self.topic = topic
        self.acked: dict[tuple[int, int], bytes] = {}
        self.latencies: list[float] = []
        self.failures = 0
        self._producer = BlockingProducer(f"acked-{topic}", cluster.namesrv.address)
        self._producer.start()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self, n: int) -> None:
        for _ in range(n):
            body = os.urandom(64)
            started = time.monotonic()
            try:
                r = self._producer.send(Message(self.topic, body))
            except Exception:
                self.failures += 1
                continue
            self.latencies.append(time.monotonic() - started)
            if r.status is SendStatus.SEND_OK:
                self.acked[(r.queue.queue_id, r.queue_offset)] = body
            else:
                self.failures += 1

    def start_background(self, pause_s: float = 0.005) -> None:
        def run() -> None:
            while not self._stop.is_set():
                self.send(1)
                time.sleep(pause_s)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop_background(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    def lost(self) -> int:
        """Acknowledged messages not served at their offset with their body."""
        served: dict[tuple[int, int], bytes] = {}
        with BlockingPullConsumer(f"check-{time.monotonic_ns()}", self.cluster.namesrv.address) as c:
            for qid in {q for q, _ in self.acked}:
                mq = MessageQueue(self.topic, "broker-r", qid)
                offset = 0
                while True:
                    res = c.pull(mq, "*", offset, 32)
                    if not res.messages:
                        break
                    for m in res.messages:
                        served[(qid, m.queue_offset)] = m.body
                    offset = res.next_begin_offset
        return sum(1 for k, body in self.acked.items() if served.get(k) != body)

    def close(self) -> None:
        self.stop_background()
        self._producer.shutdown()

    def figures(self) -> dict[str, Any]:
        lat = sorted(self.latencies) or [0.0]
        return {
            "acked": len(self.acked),
            "send_failures": self.failures,
            "send_p50_ms": round(lat[len(lat) // 2] * 1000, 2),
            "send_max_ms": round(lat[-1] * 1000, 1),
        }


def runtime_table(cluster: Cluster) -> dict[str, str]:
    resp = runtime_info(cluster.broker_address)
    assert resp is not None and resp.code == ResponseCode.SUCCESS
    return orjson.loads(resp.body)["table"]


def listing(root: Path) -> set[str]:
    """Every path under ``root`` but the data directory and logs: what a hostile name could create."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel.startswith("broker-data"):
            dirnames.clear()
            continue
        out |= {os.path.join(rel, n) for n in dirnames + filenames if not n.endswith(".log")}
    return out


# --------------------------------------------------------------------------- 1-2: names that become paths

_name_chars = st.sampled_from(
    list("abcXYZ019_-%|") + ["/", ".", "..", "\n", "\x00", " ", "é", "\\", "~", "@"]
)
_names = st.one_of(
    st.lists(_name_chars, min_size=0, max_size=40).map("".join),
    st.sampled_from(
        [
            "x/../Victim",
            "../../..",
            "../../outside",
            f"{VICTIM}\n",
            "..",
            ".",
            "/etc",
            "a" * 300,
            "%RETRY%../x",
            "Victim/0",
        ]
    ),
)
_entries = st.sampled_from(
    ["send", "send_retry", "send_back", "heartbeat", "pull", "update_offset", "create", "delete", "register"]
)


class NamePeer:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.broker = RawConn(cluster.broker_address)
        self.namesrv = RawConn(cluster.namesrv.address)
        self.tried = 0
        self.refused = 0
        self.accepted_invalid: list[tuple[str, str]] = []

    def request(self, entry: str, name: str) -> None:
        self.tried += 1
        conn = self.broker
        valid = check_group_name(name) is None if entry in ("send_back", "heartbeat", "pull") else None
        if entry == "send":
            cmd = RemotingCommand.request(RC.SEND_MESSAGE, _send_fields(name), b"x")
            valid = check_stored_topic_name(name) is None and len(name) <= 127
        elif entry == "send_retry":
            cmd = RemotingCommand.request(RC.SEND_MESSAGE, _send_fields("%RETRY%" + name), b"x")
            valid = check_group_name(name) is None
        elif entry == "send_back":
            cmd = RemotingCommand.request(
                RC.CONSUMER_SEND_MSG_BACK, {"group": name, "offset": 0, "delayLevel": -1}
            )
        elif entry == "heartbeat":
            valid = valid or name == ""  # an entry without a group name is skipped, as RocketMQ does
            body = {"clientID": "fuzz", "consumerDataSet": [{"groupName": name, "subscriptionDataSet": []}]}
            cmd = RemotingCommand.request(RC.HEART_BEAT, {}, orjson.dumps(body))
        elif entry == "pull":
            cmd = RemotingCommand.request(RC.PULL_MESSAGE, pull_fields(VICTIM, group=name))
        elif entry == "update_offset":
            cmd = RemotingCommand.request(
                RC.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": name, "topic": name, "queueId": 0, "commitOffset": 1},
            )
            valid = check_group_name(name) is None and check_stored_topic_name(name) is None
        elif entry == "create":
            cmd = RemotingCommand.request(
                RC.UPDATE_AND_CREATE_TOPIC,
                {"topic": name, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6},
            )
            valid = check_stored_topic_name(name) is None and len(name) <= 127
        elif entry == "delete":
            cmd = RemotingCommand.request(RC.DELETE_TOPIC_IN_BROKER, {"topic": name})
            valid = check_stored_topic_name(name) is None
            if name == VICTIM:
                return  # deleting the victim by its real name is an operator's right, not an attack
        else:
            conn = self.namesrv
            table = {name: TopicConfig(name, 1, 1)}
            raw = RegisterBrokerBody(TopicConfigSerializeWrapper(table, DataVersion(1, self.tried))).encode()
            cmd = RemotingCommand.request(
                RC.REGISTER_BROKER,
                {"brokerName": "fuzz", "brokerAddr": "127.0.0.9:1", "clusterName": "C", "brokerId": 0},
                raw,
            )
            valid = check_stored_topic_name(name) is None
        resp = conn.call(cmd, 10)
        assert resp is not None, f"{entry} {name!r}: no answer"
        if resp.code != ResponseCode.SUCCESS:
            self.refused += 1
        elif not valid and entry not in ("pull",):
            self.accepted_invalid.append((entry, name))

    def close(self) -> None:
        self.broker.close()
        self.namesrv.close()


def _send_fields(topic: str) -> dict[str, Any]:
    return {
        "producerGroup": "fuzz",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": "",
    }


def run_name_fuzz(cluster: Cluster, examples: int) -> dict[str, Any]:
    producer = Acked(cluster)
    producer.send(50)
    before = listing(cluster.root)
    peer = NamePeer(cluster)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(_entries, _names)
    def fuzz(entry: str, name: str) -> None:
        peer.request(entry, name)
        if peer.tried % 20 == 0:
            producer.send(2)

    try:
        fuzz()
    finally:
        peer.close()
    producer.send(20)
    assert_broker_serves(cluster)
    created_outside = sorted(listing(cluster.root) - before)
    cq_names = [p.name for p in (cluster.data_dir / "consumequeue").iterdir()]
    bad_dirs = [n for n in cq_names if check_stored_topic_name(n) is not None]
    lost_live = producer.lost()
    cluster.stop_broker()
    cluster.start_broker()
    lost_after_restart = producer.lost()
    producer.close()
    figures = {
        "inputs": peer.tried,
        "refused": peer.refused,
        "accepted_invalid": len(peer.accepted_invalid),
        "paths_created_outside_data_dir": len(created_outside),
        "invalid_queue_dirs": len(bad_dirs),
        "acked_lost": lost_live,
        "acked_lost_after_restart": lost_after_restart,
        **producer.figures(),
    }
    assert not peer.accepted_invalid, peer.accepted_invalid[:10]
    assert not created_outside, created_outside[:10]
    assert not bad_dirs, bad_dirs[:10]
    assert lost_live == 0 and lost_after_restart == 0
    return figures


class TestHostileNames:
    def test_fuzzed_names_through_every_entry(self, cluster: Cluster) -> None:
        report("hostile-names", **run_name_fuzz(cluster, 300))

    @pytest.mark.slow
    def test_fuzzed_names_through_every_entry_long(self, cluster: Cluster) -> None:
        report("hostile-names-long", **run_name_fuzz(cluster, 3000))


# --------------------------------------------------------------------------- 3: one process per data dir


class TestDataDirInUse:
    def test_second_processes_on_a_live_directory_are_refused(self, cluster: Cluster) -> None:
        producer = Acked(cluster)
        producer.start_background()
        refused = 0
        messages: list[str] = []
        try:
            for command in ("broker", "standalone", "broker"):
                port = free_port()
                args = [sys.executable, "-m", "tidemq", command, "--data-dir", str(cluster.data_dir)]
                if command == "broker":
                    args += ["--listen", f"127.0.0.1:{port}", "--namesrv", "127.0.0.1:1"]
                else:
                    args += [
                        "--broker-listen",
                        f"127.0.0.1:{port}",
                        "--namesrv-listen",
                        f"127.0.0.1:{free_port()}",
                    ]
                proc = subprocess.run(args, capture_output=True, timeout=60)
                err = proc.stderr.decode()
                messages.append(err.strip().splitlines()[-1] if err.strip() else "")
                if proc.returncode == 2 and "is in use by pid" in err:
                    refused += 1
                assert "Traceback" not in err, err[-2000:]
            time.sleep(0.3)
        finally:
            producer.stop_background()
        assert (cluster.data_dir / "abort").exists()  # the live broker's marker was left alone
        assert_broker_serves(cluster)
        lost = producer.lost()
        producer.close()
        report("data-dir-in-use", attempts=3, refused=refused, acked_lost=lost, **producer.figures())
        assert refused == 3, messages
        assert lost == 0


# --------------------------------------------------------------------------- 4: decompression bombs


def _zlib_bomb(inflated: int) -> bytes:
    c = zlib.compressobj(9)
    chunk = bytes(1 << 20)
    out = [c.compress(chunk) for _ in range(inflated >> 20)]
    return b"".join(out) + c.flush()


class TestDecompressionBombs:
    def test_register_bodies_that_inflate_to_a_gibibyte(self, cluster: Cluster) -> None:
        bomb = _zlib_bomb(1 << 30)  # ~1 MiB on the wire
        ns = RawConn(cluster.namesrv.address)
        rss0 = rss_kib(cluster.namesrv.pid)
        answers = []
        try:
            for i in range(5):
                cmd = RemotingCommand.request(
                    RC.REGISTER_BROKER,
                    {
                        "brokerName": f"bomb{i}",
                        "brokerAddr": "127.0.0.9:1",
                        "clusterName": "C",
                        "brokerId": 0,
                        "compressed": "true",
                    },
                    bomb,
                )
                started = time.monotonic()
                resp = ns.call(cmd, 30)
                answers.append(time.monotonic() - started)
                assert resp is not None and resp.code == ResponseCode.SYSTEM_ERROR
                assert "inflates to more than" in (resp.remark or ""), resp.remark
        finally:
            ns.close()
        rss1 = rss_kib(cluster.namesrv.pid)
        report(
            "decompression-bombs",
            bombs=len(answers),
            bomb_wire_bytes=len(bomb),
            inflated_bytes=1 << 30,
            answer_max_ms=round(max(answers) * 1000, 1),
            namesrv_rss_before_kib=rss0,
            namesrv_rss_after_kib=rss1,
        )
        assert rss1 - rss0 < 64 * 1024
        assert cluster.namesrv.alive()


# --------------------------------------------------------------------------- 6: held pulls


class TestHeldPulls:
    def test_held_pulls_end_with_their_connections_and_are_bounded(self, cluster: Cluster) -> None:
        raise_nofile(4096)
        admin = RawConn(cluster.broker_address)
        created = admin.call(
            RemotingCommand.request(
                RC.UPDATE_AND_CREATE_TOPIC, {"topic": "HeldTopic", "readQueueNums": 1, "writeQueueNums": 1}
            )
        )
        admin.close()
        assert created is not None and created.code == ResponseCode.SUCCESS
        producer = Acked(cluster, "HeldTopic")
        producer.send(1)  # queue 0 holds offset 0: pulls at offset 1 wait for the next message
        conns = [RawConn(cluster.broker_address) for _ in range(8)]
        rss0 = rss_kib(cluster.broker.pid)
        busy = 0
        try:
            for conn in conns:
                for i in range(300):
                    cmd = RemotingCommand.request(
                        RC.PULL_MESSAGE,
                        pull_fields("HeldTopic", group=f"held-{i % 4}", offset=1, suspend_ms=3_600_000),
                    )
                    conn.send_cmd(cmd)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and int(runtime_table(cluster)["pullRequestsHeld"]) < 1600:
                time.sleep(0.1)
            held = int(runtime_table(cluster)["pullRequestsHeld"])
            for conn in conns:  # the pulls over the bound were answered SYSTEM_BUSY at once
                while (resp := conn.recv_cmd(0.5)) is not None:
                    busy += resp.code == ResponseCode.SYSTEM_BUSY
        finally:
            for conn in conns:
                conn.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and int(runtime_table(cluster)["pullRequestsHeld"]):
            time.sleep(0.1)
        after = int(runtime_table(cluster)["pullRequestsHeld"])
        rss1 = rss_kib(cluster.broker.pid)
        assert_broker_serves(cluster)
        lost = producer.lost()
        producer.close()
        report(
            "held-pulls",
            connections=8,
            pulls_sent=8 * 300,
            held_at_peak=held,
            answered_busy=busy,
            held_after_close=after,
            rss_before_kib=rss0,
            rss_after_kib=rss1,
            acked_lost=lost,
        )
        assert held == 8 * 200 and busy == 8 * 100
        assert after == 0 and lost == 0


# --------------------------------------------------------------------------- 7: batches and metadata floods


class TestFloods:
    def test_batches_of_100_000_tiny_messages(self, cluster: Cluster) -> None:
        producer = Acked(cluster)
        producer.start_background()
        body = encode_batch([BatchItem(b"", 0, {}) for _ in range(100_000)])
        conn = RawConn(cluster.broker_address)
        answers = []
        try:
            for _ in range(10):
                fields = {**_send_fields("BatchFlood"), "batch": "true"}
                started = time.monotonic()
                resp = conn.call(RemotingCommand.request(RC.SEND_BATCH_MESSAGE, fields, body), 30)
                answers.append(time.monotonic() - started)
                assert resp is not None and resp.code == ResponseCode.MESSAGE_ILLEGAL, resp
                assert "more than 4096 messages" in (resp.remark or "")
        finally:
            conn.close()
            producer.stop_background()
        assert_broker_serves(cluster)
        lost = producer.lost()
        producer.close()
        report(
            "batch-flood",
            batches=len(answers),
            messages_per_batch=100_000,
            batch_bytes=len(body),
            answer_max_ms=round(max(answers) * 1000, 1),
            acked_lost=lost,
            **producer.figures(),
        )
        assert lost == 0 and producer.failures == 0

    def test_two_thousand_new_groups(self, cluster: Cluster) -> None:
        producer = Acked(cluster)
        producer.start_background(pause_s=0.001)
        time.sleep(0.5)
        conn = RawConn(cluster.broker_address)
        started = time.monotonic()
        try:
            for i in range(2000):
                body = {"clientID": "flood", "consumerDataSet": [{"groupName": f"flood-{i}"}]}
                conn.send_cmd(RemotingCommand.request(RC.HEART_BEAT, {}, orjson.dumps(body)))
            answered = 0
            while answered < 2000 and (resp := conn.recv_cmd(30)) is not None:
                if not resp.flag & FLAG_RESPONSE:
                    continue  # NOTIFY_CONSUMER_IDS_CHANGED to this "consumer"
                assert resp.code == ResponseCode.SUCCESS
                answered += 1
        finally:
            conn.close()
        flood_s = time.monotonic() - started
        time.sleep(0.5)
        producer.stop_background()
        path = cluster.data_dir / "config" / "subscriptionGroup.json"
        deadline = time.monotonic() + 10
        groups = 0
        while time.monotonic() < deadline:
            groups = sum(
                1 for g in orjson.loads(path.read_bytes())["subscriptionGroupTable"] if g.startswith("flood-")
            )
            if groups == 2000:
                break
            time.sleep(0.1)
        assert_broker_serves(cluster)
        lost = producer.lost()
        producer.close()
        report(
            "group-flood",
            new_groups=answered,
            flood_seconds=round(flood_s, 2),
            groups_in_file=groups,
            acked_lost=lost,
            **producer.figures(),
        )
        assert answered == 2000 and groups == 2000 and lost == 0


# --------------------------------------------------------------------------- 9: heartbeat bodies

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
_heartbeats = st.fixed_dictionaries(
    {},
    optional={
        "clientID": _json,
        "consumerDataSet": _json
        | st.lists(
            st.fixed_dictionaries(
                {},
                optional={
                    "groupName": _json | _names,
                    "subscriptionDataSet": _json
                    | st.lists(
                        st.dictionaries(st.sampled_from(["topic", "subString", "codeSet", "tagsSet"]), _json)
                    ),
                    "consumeType": _json,
                },
            ),
            max_size=3,
        ),
        "producerDataSet": _json
        | st.lists(st.dictionaries(st.just("groupName"), _json | _names), max_size=3),
    },
)


def run_heartbeat_fuzz(cluster: Cluster, examples: int) -> dict[str, int]:
    conn = RawConn(cluster.broker_address)
    counts = {"sent": 0, "success": 0, "refused": 0}

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(_heartbeats)
    def fuzz(body: dict[str, Any]) -> None:
        counts["sent"] += 1
        resp = conn.call(RemotingCommand.request(RC.HEART_BEAT, {}, orjson.dumps(body)), 10)
        assert resp is not None
        if resp.code == ResponseCode.SUCCESS:
            counts["success"] += 1
        else:
            counts["refused"] += 1
            assert resp.code == ResponseCode.SYSTEM_ERROR
            # A named field, not a Python exception's name.
            assert "Error:" not in (resp.remark or ""), resp.remark

    try:
        fuzz()
    finally:
        conn.close()
    assert_broker_serves(cluster)
    return counts


class TestHeartbeatBodies:
    def test_fuzzed_heartbeats_get_clear_answers(self, cluster: Cluster) -> None:
        report("heartbeat-fuzz", **run_heartbeat_fuzz(cluster, 300))

    def test_broker_log_has_no_tracebacks(self, cluster: Cluster) -> None:
        """After the module's tests, or alone (``-k``, xdist): hostile bodies of its own first, so
        the log always holds something to check."""
        run_heartbeat_fuzz(cluster, 40)
        assert_log_clean(cluster)
