"""Network partitions and an etcd outage with the in-sync set (issue 25), with real processes.

- The master cut off from etcd *and* its slaves by a veth link going down (its own network
  namespace; a producer inside that namespace still reaches it): it acknowledges nothing once its
  in-sync slaves are gone, the other side elects within the bound, no two masters acknowledge at
  overlapping times; healed, the old master truncates its unacknowledged tail and follows.
- etcd stopped under the default ``keep_serving_without_etcd = "in_sync"``: a SYNC master keeps
  acknowledging through its in-sync set, nobody is elected, the epoch stays.

Timing (see :mod:`controller_support`): lease TTL 2 s, renewal 0.4 s, fencing margin 0.6 s,
``sync_timeout_s`` 2 s.  Both tests are slow (~20-25 s each on a loaded 2-core machine).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from controller_support import (  # noqa: E402
    NEW_MASTER_BOUND_S,
    TOPIC,
    ControllerCluster,
    EtcdServer,
    LoadProducer,
    Replica,
    ack_spans,
    check_acked,
    check_no_loss,
    commit_log,
    namespace_group,
    network_namespaces,
    overlapping_masters,
    stop_group,
    sync_set,
    verify_replicas,
    wait_in_sync,
)

#: ``sync_timeout_s`` of the test groups: the longest a send can wait for its slaves' acknowledgements.
SYNC_TIMEOUT_S = 2.0
#: The lease TTL of the test groups (``ttl_s``).
TTL_S = 2.0
#: How long the master stays cut off: several TTLs and in-sync-set shrink periods (3 s by default).
HOLD_S = 8.0

#: A producer run inside the master's namespace (``ip netns exec``): it keeps reaching the master
#: once the link is down (through its cached route).  Prints, per send, ``<start> <end> <status>
#: <store port> <UNIQ_KEY> <body>`` (monotonic clock: the same for every process of the machine).
NS_PRODUCER = """
import sys, time, uuid
from tidemq.client import BlockingProducer, Message
ns, topic = sys.argv[1], sys.argv[2]
producer = BlockingProducer("part-ns-pg", ns, retry_times=0, send_timeout=3.0, route_refresh_s=0.5)
producer.start()
print("ready", flush=True)
i = 0
while True:
    body = "ns-%07d-%s" % (i, uuid.uuid4().hex)
    i += 1
    start = time.monotonic()
    try:
        r = producer.send(Message(topic, body.encode()))
    except Exception as exc:
        print(f"{start:.6f} {time.monotonic():.6f} ERROR 0 - {body}", flush=True)
        time.sleep(0.02)
        continue
    port = int(r.offset_msg_id[8:16], 16) if len(r.offset_msg_id) >= 16 else 0
    print(f"{start:.6f} {time.monotonic():.6f} {r.status.value} {port} {r.msg_id} {body}", flush=True)
"""


@pytest.fixture
def namespaces() -> Any:
    with network_namespaces() as make:
        yield make


class NamespaceProducer:
    """:data:`NS_PRODUCER` in network namespace ``netns``; collects what it was told."""

    def __init__(self, netns: str, ns: str, cwd: Path) -> None:
        self.acked: dict[str, bytes] = {}
        self.ack_times: list[tuple[float, int]] = []  # (monotonic, store port), as LoadProducer's
        self.sends: list[tuple[float, str, bytes]] = []  # (start, status, body) of every send
        self.statuses: dict[str, int] = {}
        self.log_path = cwd / f"ns-producer-{netns}.log"
        self._log = open(self.log_path, "wb")
        cmd = ["ip", "netns", "exec", netns, sys.executable, "-c", NS_PRODUCER, ns, TOPIC]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, cwd=cwd)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            self.stop()
            raise AssertionError(
                f"the producer in {netns} did not start: {self.log_path.read_text()[-3000:]}"
            )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            parts = raw.decode().split()
            if len(parts) != 6:
                continue  # cut short by the kill
            start, end, status, port, key, body = parts
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.sends.append((float(start), status, body.encode()))
            if status == "SEND_OK":
                self.acked[key] = body.encode()
                self.ack_times.append((float(end), int(port)))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if hasattr(self, "_thread"):
            self._thread.join(10)
        self._log.close()


def count_statuses(sends: list[tuple[float, str, bytes]], after: float, before: float) -> dict[str, int]:
    counts: dict[str, int] = {}
    for start, status, _ in sends:
        if after < start < before:
            counts[status] = counts.get(status, 0) + 1
    return counts


def port_of(replica: Replica) -> int:
    return int(replica.addr.rsplit(":", 1)[1])


@pytest.mark.slow
def test_a_master_cut_off_from_etcd_and_its_slaves_stops_acknowledging_and_rejoins_as_slave(
    spawn: Any, tmp_path: Path, namespaces: Any
) -> None:
    net = namespaces(1)
    # Replica 1 (the first master) alone in namespace 1; etcd, the NameServer and replicas 2 and 3 here.
    cluster = namespace_group(spawn, tmp_path, net, "SYNC_MASTER", 3, {1: 1})
    old, s2, s3 = cluster.replicas
    load: LoadProducer | None = None
    inside: NamespaceProducer | None = None
    try:
        load = LoadProducer(cluster.ns)
        inside = NamespaceProducer(net.names[1], cluster.ns, tmp_path)
        assert wait_for(lambda: len(load.acked) >= 50 and len(inside.acked) >= 50, 30), (
            load.statuses,
            inside.statuses,
        )
        net.cut(1)
        cut = time.monotonic()
        # The other side elects one of the two slaves.
        assert wait_for(lambda: "SYNC_MASTER" in (s2.role(), s3.role()), NEW_MASTER_BOUND_S + 5), (
            s2.log() + s3.log()
        )
        elected = time.monotonic() - cut
        new, other = (s2, s3) if s2.role() == "SYNC_MASTER" else (s3, s2)
        assert wait_for(lambda: load.acked_by(port_of(new), cut) is not None, NEW_MASTER_BOUND_S + 5), (
            load.statuses,
            load.errors,
            new.log(),
        )
        first = load.acked_by(port_of(new), cut)
        assert first is not None
        count = len(load.acked)
        assert wait_for(lambda: len(load.acked) >= count + 50, 20), (load.statuses, load.errors)
        # Hold the partition for several lease TTLs and shrink periods: time for a wrong acknowledgement.
        time.sleep(max(0.0, cut + HOLD_S - time.monotonic()))
        net.heal(1)
        healed = time.monotonic()
        # Healed: the old master learns it was deposed, truncates its unacknowledged tail, follows.
        assert wait_for(
            lambda: old.role() == "SLAVE" and old.info().get("haMasterConnected") == "true", 30
        ), old.log()
        # It cut exactly what the new master does not hold: back to where the new epoch starts.
        started = re.search(
            rf"broker {new.broker_id} is SYNC_MASTER of epoch \d+ from offset (\d+)", new.full_log()
        )
        truncated = re.search(
            rf"broker {old.broker_id} truncated its commit log from (\d+) to (\d+)", old.full_log()
        )
        assert started and truncated, (new.log(), old.log())
        assert int(truncated[1]) > int(truncated[2]) == int(started[1]), (truncated[0], started[0])
        assert wait_for(lambda: sync_set(new) == {1, 2, 3}, 30), new.info()  # caught up: in sync again
        assert old.info()["controllerEpoch"] == new.info()["controllerEpoch"]
        count = len(load.acked)
        assert wait_for(lambda: len(load.acked) >= count + 50, 20), (load.statuses, load.errors)
    finally:
        if inside is not None:
            inside.stop()
        if load is not None:
            load.stop()
    try:
        print(
            f"cut: new master elected after {elected:.2f} s, acknowledging after {first - cut:.2f} s; "
            f"producer inside the cut-off namespace while cut: {count_statuses(inside.sends, cut, healed)}, "
            f"all along: {inside.statuses}; outside while cut: {load.statuses_between(cut, healed)}, "
            f"all along: {load.statuses}, errors {load.errors}"
        )
        assert first - cut <= NEW_MASTER_BOUND_S
        # The isolated master acknowledged nothing once cut off (answers in flight at the cut aside).
        spans = ack_spans(load.ack_times + inside.ack_times)
        assert spans[port_of(old)][1] <= cut + SYNC_TIMEOUT_S, (spans, cut)
        late = [t for t, p in inside.ack_times if p == port_of(old) and t > cut + SYNC_TIMEOUT_S]
        assert not late, f"{len(late)} sends acknowledged by the cut-off master after the cut"
        # Never two masters acknowledging at overlapping times.
        assert not overlapping_masters(load.ack_times + inside.ack_times), spans
        # Every replica holds the same bytes; what the cut-off master stored alone is gone.
        end = int(new.info()["commitLogMaxOffset"])
        for r in cluster.replicas:
            assert wait_for(lambda r=r: int(r.info()["commitLogMaxOffset"]) == end, 30), (
                r.broker_id,
                r.info(),
            )
        logs = {r.broker_id: commit_log(r, end) for r in cluster.replicas}
        assert logs[old.broker_id] == logs[new.broker_id] == logs[other.broker_id]
        # Sent while cut off (the producer inside could reach no other broker), never acknowledged.
        stored_alone = [
            b for start, status, b in inside.sends if cut < start < healed and status != "SEND_OK"
        ]
        assert stored_alone, inside.statuses
        kept = [b for b in stored_alone if b in logs[old.broker_id]]
        assert not kept, f"{len(kept)} of {len(stored_alone)} unacknowledged sends still in the log"
        check_acked({**load.acked, **inside.acked}, cluster.ns)
        verify_replicas(cluster.replicas)
    finally:
        stop_group(cluster)


@pytest.mark.slow
def test_without_etcd_a_sync_master_keeps_acknowledging_through_its_in_sync_set(
    spawn: Any, tmp_path: Path
) -> None:
    """Default ``keep_serving_without_etcd`` ("in_sync"): etcd stopped for 3 lease TTLs, the SYNC
    master keeps acknowledging, nobody is elected; etcd back: same master, same epoch."""
    own = EtcdServer(tmp_path / "etcd-own")
    own.directory.mkdir()
    own.start()
    try:
        cluster = ControllerCluster(spawn, tmp_path, own)
        master = cluster.wait_master()
        slaves = [r for r in cluster.replicas if r is not master]
        assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
        wait_in_sync(master, 3)
        epoch = master.info()["controllerEpoch"]
        load = LoadProducer(cluster.ns)
        try:
            assert wait_for(lambda: len(load.acked) >= 50, 20), (load.statuses, load.errors)
            own.stop()
            stopped = time.monotonic()
            before = len(load.acked)
            while time.monotonic() < stopped + 3 * TTL_S:
                # Nobody is elected or fenced: same roles, same epoch everywhere.
                assert master.role() == "SYNC_MASTER", master.log()
                assert all(s.role() == "SLAVE" for s in slaves), [s.log() for s in slaves]
                assert {r.info()["controllerEpoch"] for r in cluster.replicas} == {epoch}
                time.sleep(0.5)
            during = [t for t, _ in list(load.ack_times) if stopped < t <= stopped + 3 * TTL_S]
            gaps = [b - a for a, b in zip([stopped, *during], [*during, stopped + 3 * TTL_S], strict=True)]
            assert len(load.acked) - before >= 100, (load.statuses, load.errors)
            outage = load.statuses_between(stopped, stopped + 3 * TTL_S)
            assert set(outage) == {"SEND_OK"}, outage  # every send acknowledged, none refused
            assert max(gaps) < 1.0, f"acknowledgements stalled {max(gaps):.2f} s without etcd"
            assert {p for t, p in load.ack_times if t > stopped} == {port_of(master)}
            own.start()
            restarted = time.monotonic()
            count = len(load.acked)
            assert wait_for(lambda: len(load.acked) >= count + 50, 20), (load.statuses, load.errors)
            time.sleep(3 * TTL_S)  # long enough for a lease that etcd forgot to expire
            assert cluster.master() is master
            assert {r.info()["controllerEpoch"] for r in cluster.replicas} == {epoch}
            assert all(s.role() == "SLAVE" for s in slaves)
            after = [t for t, _ in list(load.ack_times) if t > restarted]
            assert after and max(b - a for a, b in zip(after, after[1:], strict=False)) < 1.0
        finally:
            load.stop()
        print(
            f"without etcd for {3 * TTL_S:.0f} s: {len(during)} sends acknowledged, longest gap "
            f"{max(gaps):.2f} s; statuses {load.statuses}, errors {load.errors}"
        )
        check_no_loss(load, cluster.ns)
    finally:
        own.stop()
