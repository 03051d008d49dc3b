"""Consumers across controller failovers and partitioned slaves (issue 25).

Consumers: offsets are replicated, nothing acknowledged is missed, re-deliveries stay within one
offset-sync interval.  Partitions (slow): slaves in network namespaces cut off by a veth link going
down; SYNC_MASTER goes on through the slave left and refuses without any, ASYNC_MASTER goes on.

Real processes: etcd, a NameServer and three ``SYNC_MASTER`` controller brokers (see
:mod:`controller_support`).  The slaves copy consumer offsets every ``metadata_sync_s`` (the
controller's default, 1 s, is left in place here).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import wait_for

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from controller_support import (  # noqa: E402
    TOPIC,
    ControllerCluster,
    EtcdServer,
    LoadProducer,
    Namespaces,
    Replica,
    check_no_loss,
    etcd_fixture,  # noqa: F401  (the etcd fixture)
    namespace_group,
    network_namespaces,
    stop_group,
    sync_set,
)

from tidemq.client import BlockingPushConsumer  # noqa: E402
from tidemq.client.admin import AdminClient  # noqa: E402
from tidemq.remoting.codes import RequestCode  # noqa: E402
from tidemq_controller.options import ControllerOptions  # noqa: E402

#: The consumers' own commit period (offsets also ride on every pull as the commit flag).
PERSIST_S = 0.5
#: The controller's default offset-sync period, which the re-delivery bound is checked against.
SYNC_S = 1.0
#: Slack for a loaded 2-core machine: scheduling, one pull round trip, the slave's sync round.
SLACK_S = 1.5

#: A consumer in its own process, SIGKILLed with the master: it never commits its last offsets.
#: Prints ``<UNIQ_KEY> <wall time>`` per consumed message.
CRASHING_CONSUMER = """
import sys, time
from tidemq.client import BlockingPushConsumer
group, ns, topic, persist = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
consumer = BlockingPushConsumer(group, ns, consume_from="CONSUME_FROM_FIRST_OFFSET",
                                persist_interval_s=persist, pull_error_delay_s=0.2, route_refresh_s=0.5)
consumer.subscribe(topic)
def listener(msgs):
    for m in msgs:
        sys.stdout.write(f"{m.uniq_key} {time.time():.3f}\\n")
    sys.stdout.flush()
consumer.register_listener(listener)
consumer.start()
sys.stdout.write("started\\n")
sys.stdout.flush()
while True:
    time.sleep(1)
"""


class Consumed:
    """What one consumer group received: UNIQ_KEY -> wall times (one per delivery)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.lock = threading.Lock()

    def add(self, key: str, at: float) -> None:
        with self.lock:
            self.times.setdefault(key, []).append(at)

    def keys(self) -> set[str]:
        with self.lock:
            return set(self.times)

    def redelivered(self) -> int:
        with self.lock:
            return sum(len(t) - 1 for t in self.times.values())


def push_consumer(group: str, ns: str, into: Consumed) -> BlockingPushConsumer:
    consumer = BlockingPushConsumer(
        group,
        ns,
        consume_from="CONSUME_FROM_FIRST_OFFSET",
        persist_interval_s=PERSIST_S,
        pull_error_delay_s=0.2,
        route_refresh_s=0.5,
    )
    consumer.subscribe(TOPIC)

    def listener(msgs: list[Any]) -> None:
        for m in msgs:
            into.add(m.uniq_key or "", time.time())

    consumer.register_listener(listener)
    consumer.start()
    return consumer


class CrashingConsumer:
    """:data:`CRASHING_CONSUMER` in a subprocess; its output read on a thread."""

    def __init__(self, group: str, ns: str, into: Consumed) -> None:
        self.into = into
        self.started = threading.Event()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CRASHING_CONSUMER, group, ns, TOPIC, str(PERSIST_S)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode().split()
            if line == ["started"]:
                self.started.set()
            elif len(line) == 2:
                self.into.add(line[0], float(line[1]))

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self.thread.join(10)


def broker_call(addr: str, code: int, fields: dict[str, Any] | None = None) -> Any:
    async def ask() -> Any:
        client = AdminClient("127.0.0.1:1")
        try:
            resp = await client.call(addr, code, fields)
        finally:
            await client.close()
        return resp

    return asyncio.run(ask())


def committed_offsets(addr: str, group: str) -> dict[int, int]:
    """The broker's committed offsets of ``group`` on the topic, by queue id."""
    body = orjson.loads(broker_call(addr, RequestCode.GET_ALL_CONSUMER_OFFSET).body or b"{}")
    table = body.get("offsetTable", {}).get(f"{TOPIC}@{group}", {})
    return {int(q): int(o) for q, o in table.items()}


def max_offsets(addr: str, queues: int) -> dict[int, int]:
    out = {}
    for q in range(queues):
        resp = broker_call(addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": q})
        out[q] = int(resp.ext_fields["offset"])
    return out


def test_the_controller_syncs_consumer_offsets_every_second_by_default() -> None:
    assert ControllerOptions().metadata_sync_s == SYNC_S


# Under -m slow for the default suite's time budget (~12 s); the slow five-failover test below
# covers the same and more; test_controller_failover's default test keeps a SIGKILL failover.
@pytest.mark.slow
def test_consumers_keep_their_offsets_across_a_sigkilled_master(
    spawn: Any, tmp_path: Path, etcd: EtcdServer
) -> None:
    """A live push consumer moves to the new master; a consumer that crashes with the master
    resumes, in a new process, from the offset the slave copied: re-reading only what was
    consumed within one offset-sync interval before the kill."""
    cluster = ControllerCluster(spawn, tmp_path, etcd, options={"metadata_sync_s": None})
    master = cluster.wait_master()
    assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
    live_group, crash_group = f"live-{uuid.uuid4().hex[:6]}", f"crash-{uuid.uuid4().hex[:6]}"
    live, crashed, resumed = Consumed(), Consumed(), Consumed()
    load = LoadProducer(cluster.ns)
    consumers: list[BlockingPushConsumer] = []
    crashing: CrashingConsumer | None = None
    try:
        assert wait_for(lambda: len(load.acked) >= 20, 20), (load.statuses, load.errors)
        consumers.append(push_consumer(live_group, cluster.ns, live))
        crashing = CrashingConsumer(crash_group, cluster.ns, crashed)
        assert crashing.started.wait(30)
        # Both consume under load for longer than the re-delivery window below.
        assert wait_for(lambda: len(crashed.keys()) >= 100 and len(live.keys()) >= 100, 30), (
            len(crashed.keys()),
            len(live.keys()),
        )
        time.sleep(3.5)
        killed_at = time.time()
        master.kill()
        crashing.kill()
        new = cluster.wait_master(15)
        assert new is not master
        # The crashed group comes back (a new process would do the same) on the new master.
        consumers.append(push_consumer(crash_group, cluster.ns, resumed))
        after = len(load.acked)
        assert wait_for(lambda: len(load.acked) >= after + 50, 20), (load.statuses, load.errors)
    finally:
        load.stop()
        if crashing is not None and crashing.proc.poll() is None:
            crashing.kill()
    acked = set(load.acked)
    try:
        # Every acknowledged message reaches both groups (at least once).
        assert wait_for(lambda: acked <= live.keys(), 30), len(acked - live.keys())
        assert wait_for(lambda: acked <= crashed.keys() | resumed.keys(), 30), len(
            acked - crashed.keys() - resumed.keys()
        )
        again = crashed.keys() & resumed.keys()
        # Re-deliveries are bounded by the offset-sync interval: only messages the crashed
        # consumer took in the last sync + commit interval before the kill are read again.
        window = SYNC_S + PERSIST_S + SLACK_S
        before = [k for k, t in crashed.times.items() if min(t) < killed_at - window]
        assert len(before) >= 100, "the crashed consumer must have consumed well before the window"
        old = [k for k in again if min(crashed.times[k]) < killed_at - window]
        print(
            f"re-delivered after the crash: {len(again)} of {len(crashed.keys())} consumed "
            f"(live consumer: {live.redelivered()})"
        )
        assert not old, f"{len(old)} messages consumed > {window} s before the kill were re-delivered"
        assert resumed.keys() - again, "the resumed consumer read nothing new"
        # The groups' offsets are committed on the new master and cover the whole topic.
        queues = len(committed_offsets(new.addr, live_group)) or 4
        top = max_offsets(new.addr, queues)
        for group in (live_group, crash_group):
            assert wait_for(lambda g=group: committed_offsets(new.addr, g) == top, 15), (
                group,
                committed_offsets(new.addr, group),
                top,
            )
    finally:
        for consumer in consumers:
            consumer.shutdown()
    check_no_loss(load, cluster.ns)


# ---------------------------------------------------------------------- partitioned slaves
@pytest.fixture
def namespaces() -> Any:
    with network_namespaces() as make:
        yield make


def partitioned_group(
    spawn: Any,
    tmp_path: Path,
    net: Namespaces,
    role: str,
    slaves: int,
    options: dict[str, Any] | None = None,
) -> ControllerCluster:
    """Replica 1 (here) is elected first; then the slaves start, each in its own namespace."""
    placed = {k + 1: k for k in range(1, slaves + 1)}
    return namespace_group(spawn, tmp_path, net, role, slaves + 1, placed, options)


def acks_after(load: LoadProducer, t: float) -> int:
    return sum(1 for at, _ in list(load.ack_times) if at > t)


def caught_up(master: Replica, slaves: list[Replica]) -> bool:
    end = master.info()["commitLogMaxOffset"]
    return all(s.info()["commitLogMaxOffset"] == end for s in slaves)


#: ``sync_set_timeout_s`` (the default): how long an in-sync slave may lag before it is dropped.
SYNC_SET_TIMEOUT_S = ControllerOptions().sync_set_timeout_s
#: ``sync_timeout_s`` of the test groups (controller_support): how long a send waits for its slaves.
SYNC_TIMEOUT_S = 2.0


def refused(load: LoadProducer) -> int:
    return load.statuses.get("FLUSH_SLAVE_TIMEOUT", 0) + load.statuses.get("SLAVE_NOT_AVAILABLE", 0)


def longest_stall(load: LoadProducer, after: float, acks: int) -> float:
    """The longest gap between acknowledgements, from the last one before ``after`` through the
    ``acks``-th one after it."""
    times = sorted(t for t, _ in list(load.ack_times))
    before = [t for t in times if t <= after][-1:]
    window = before + [t for t in times if t > after][:acks]
    return max(b - a for a, b in zip(window, window[1:], strict=False))


@pytest.mark.slow
def test_a_sync_master_shrinks_its_in_sync_set_to_the_slave_left_and_refuses_below_two(
    spawn: Any, tmp_path: Path, namespaces: Any
) -> None:
    """SYNC_MASTER, two slaves.  One cut: sends wait for every member of the in-sync set, so they
    stall until the cut slave is dropped from it (``sync_set_timeout_s``), then go on; healed and
    caught up, it is added back.  Both cut: the set stops at two members (``min_in_sync_replicas``),
    sends answer FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE and none is acknowledged; healed, every
    acknowledged message is there."""
    net = namespaces(2)
    cluster = partitioned_group(spawn, tmp_path, net, "SYNC_MASTER", 2)
    master, s2, s3 = cluster.replicas
    load: LoadProducer | None = None
    try:
        load = LoadProducer(cluster.ns)
        assert wait_for(lambda: len(load.acked) >= 50, 20), (load.statuses, load.errors)
        assert wait_for(lambda: sync_set(master) == {1, 2, 3}, 20), master.info()
        net.cut(1)  # replica 2
        cut1 = time.monotonic()
        assert wait_for(lambda: sync_set(master) == {1, 3}, SYNC_SET_TIMEOUT_S + 10), master.info()
        shrunk = time.monotonic() - cut1
        assert wait_for(lambda: acks_after(load, cut1) >= 100, 20), (load.statuses, load.errors)
        stall1 = longest_stall(load, cut1, 100)
        one_cut = load.statuses_between(cut1, time.monotonic())
        # Every member of the set must hold a send: none is acknowledged until replica 2 is dropped.
        assert SYNC_SET_TIMEOUT_S / 2 <= stall1 <= SYNC_SET_TIMEOUT_S + SYNC_TIMEOUT_S + SLACK_S, stall1
        net.heal(1)
        healed = time.monotonic()
        assert wait_for(lambda: sync_set(master) == {1, 2, 3}, 30), master.info()
        rejoined = time.monotonic() - healed
        assert wait_for(lambda: acks_after(load, healed) >= 50, 20), (load.statuses, load.errors)
        net.cut(1)
        net.cut(2)  # no slave left
        cut2 = time.monotonic()
        before = refused(load)
        sizes = []
        while time.monotonic() < cut2 + 2 * SYNC_SET_TIMEOUT_S + SYNC_TIMEOUT_S:
            sizes.append(len(sync_set(master)))
            time.sleep(0.25)
        assert min(sizes) >= 2, sizes  # min_in_sync_replicas: the master counted
        assert refused(load) > before, load.statuses
        assert acks_after(load, cut2 + 0.5) == 0, "acknowledged with every slave cut off"
        both = load.statuses_between(cut2, time.monotonic())
        net.heal(1)
        net.heal(2)
        healed = time.monotonic()
        assert wait_for(lambda: acks_after(load, healed) >= 100, 30), (load.statuses, load.errors)
        assert wait_for(lambda: sync_set(master) == {1, 2, 3}, 30), master.info()
        assert master.role() == "SYNC_MASTER"
    finally:
        if load is not None:
            load.stop()
    try:
        assert wait_for(lambda: caught_up(master, [s2, s3]), 30), [
            r.info()["commitLogMaxOffset"] for r in (master, s2, s3)
        ]
        print(
            f"one slave cut: dropped from the in-sync set after {shrunk:.2f} s, sends stalled "
            f"{stall1:.2f} s (answers meanwhile {one_cut}); healed: back in the set after "
            f"{rejoined:.2f} s; both cut: set sizes "
            f"{sorted(set(sizes))}, statuses {both}; in all {load.statuses}, errors {load.errors}"
        )
        check_no_loss(load, cluster.ns)
    finally:
        stop_group(cluster)


@pytest.mark.slow
def test_an_async_master_keeps_acknowledging_with_its_slave_cut_off(
    spawn: Any, tmp_path: Path, namespaces: Any
) -> None:
    net = namespaces(1)
    cluster = partitioned_group(spawn, tmp_path, net, "ASYNC_MASTER", 1)
    master, slave = cluster.replicas
    load: LoadProducer | None = None
    try:
        load = LoadProducer(cluster.ns)
        assert wait_for(lambda: len(load.acked) >= 50, 20), (load.statuses, load.errors)
        net.cut(1)
        cut = time.monotonic()
        assert wait_for(lambda: acks_after(load, cut + 1.0) >= 200, 20), (load.statuses, load.errors)
        assert set(load.statuses) == {"SEND_OK"}, load.statuses
        net.heal(1)
        healed = time.monotonic()
        assert wait_for(lambda: acks_after(load, healed) >= 50, 20), (load.statuses, load.errors)
    finally:
        if load is not None:
            load.stop()
    try:
        assert wait_for(lambda: caught_up(master, [slave]), 30)
        assert slave.role() == "SLAVE" and master.role() == "ASYNC_MASTER"
        check_no_loss(load, cluster.ns)
    finally:
        stop_group(cluster)


# ---------------------------------------------------------------------- successive failovers
@pytest.mark.slow
def test_consumers_across_five_successive_failovers(spawn: Any, tmp_path: Path, etcd: EtcdServer) -> None:
    """Five rounds of: SIGKILL the master and a consumer process with it, a new master elected, the
    consumer restarted, the old master back as a slave.  Every acknowledged message is consumed by
    both groups; the live consumer reads nothing twice; the crashing group re-reads only what it
    consumed within one offset-sync interval (+ its commit period and slack) before each kill."""
    cluster = ControllerCluster(spawn, tmp_path, etcd, options={"metadata_sync_s": None})
    master = cluster.wait_master()
    assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
    live_group, crash_group = f"live-{uuid.uuid4().hex[:6]}", f"crash-{uuid.uuid4().hex[:6]}"
    live, crashed = Consumed(), Consumed()
    load = LoadProducer(cluster.ns)
    kills: list[float] = []
    consumer: BlockingPushConsumer | None = None
    crashing: CrashingConsumer | None = None
    try:
        assert wait_for(lambda: len(load.acked) >= 20, 20), (load.statuses, load.errors)
        consumer = push_consumer(live_group, cluster.ns, live)
        for _ in range(5):
            crashing = CrashingConsumer(crash_group, cluster.ns, crashed)
            assert crashing.started.wait(30)
            seen = len(crashed.keys())
            assert wait_for(lambda s=seen: len(crashed.keys()) >= s + 100, 30), (load.statuses, load.errors)
            time.sleep(3.5)
            old = cluster.wait_master()
            old.kill()
            crashing.kill()
            kills.append(time.time())  # after the consumer's death: it may consume until then
            new = cluster.wait_master(15)
            assert new is not old
            old.start()
            assert wait_for(
                lambda o=old: o.role() == "SLAVE" and o.info().get("haMasterConnected") == "true", 20
            ), old.log()
        crashing = CrashingConsumer(crash_group, cluster.ns, crashed)
        assert crashing.started.wait(30)
        after = len(load.acked)
        assert wait_for(lambda: len(load.acked) >= after + 100, 20), (load.statuses, load.errors)
    finally:
        load.stop()
    try:
        acked = set(load.acked)
        assert wait_for(lambda: acked <= live.keys() and acked <= crashed.keys(), 60), (
            len(acked - live.keys()),
            len(acked - crashed.keys()),
        )
        window = SYNC_S + PERSIST_S + SLACK_S
        again = {k: t for k, t in crashed.times.items() if len(t) > 1}
        late = []
        for key, times in again.items():
            first = min(times)
            kill = next((k for k in kills if k >= first), None)
            if kill is None or first < kill - window:
                late.append(key)
        print(
            f"5 failovers: crashing group re-read {len(again)} of {len(crashed.keys())}, "
            f"live consumer re-read {live.redelivered()} of {len(live.keys())}"
        )
        assert not late, (
            f"{len(late)} messages re-delivered that were consumed > {window} s before a kill",
            kills,
            {k: crashed.times[k] for k in late[:5]},
        )
        assert live.redelivered() == 0, live.redelivered()
    finally:
        if consumer is not None:
            consumer.shutdown()
        if crashing is not None:
            crashing.kill()
    check_no_loss(load, cluster.ns)


# ---------------------------------------------------------------------- the official client
OFFICIAL_WORKER = Path(__file__).parent / "compat" / "official_client.py"


@pytest.mark.slow
@pytest.mark.compat
def test_the_official_push_consumer_follows_a_failover(spawn: Any, tmp_path: Path, etcd: EtcdServer) -> None:
    """rocketmq==0.4.4's PushConsumer (rocketmq-client-cpp) consumes every acknowledged message of
    a topic whose master is SIGKILLed and replaced while it runs."""
    pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")
    cluster = ControllerCluster(spawn, tmp_path, etcd, options={"metadata_sync_s": None})
    master = cluster.wait_master()
    assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
    admin = [sys.executable, "-m", "tidemq", "admin", "updateTopic", "-n", cluster.ns, "-t", TOPIC]
    made = subprocess.run([*admin, "-r", "4", "-w", "4"], capture_output=True, text=True, timeout=30)
    assert made.returncode == 0, made.stderr
    run_s = 40.0
    cmd = [sys.executable, str(OFFICIAL_WORKER), "push", "--namesrv", cluster.ns, "--topic", TOPIC]
    cmd += ["--group", f"official-{uuid.uuid4().hex[:6]}", "--count", "1000000000", "--timeout", str(run_s)]
    cmd += ["--linger", "0"]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    time.sleep(3)  # its first rebalance
    load = LoadProducer(cluster.ns)
    try:
        assert wait_for(lambda: len(load.acked) >= 300, 30), (load.statuses, load.errors)
        master.kill()
        new = cluster.wait_master(15)
        assert new is not master
        after = len(load.acked)
        assert wait_for(lambda: len(load.acked) >= after + 300, 30), (load.statuses, load.errors)
    finally:
        load.stop()
    out, err = proc.communicate(timeout=run_s + 30)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, (proc.returncode, err[-2000:])
    received = json.loads(lines[-1])["received"]
    ids = {r["id"] for r in received}
    missing = set(load.acked) - ids
    print(f"official consumer: {len(received)} deliveries, {len(ids)} ids, {len(load.acked)} acknowledged")
    order = list(load.acked)
    before_kill = sum(1 for k in order[:after] if k in missing)
    assert not missing, (
        f"{len(missing)} of {len(order)} missing, {before_kill} of them acknowledged before the kill"
    )
