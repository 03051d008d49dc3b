"""A slave whose HA connection closes leaves the in-sync set until it catches up again (real store,
loopback sockets, the HA protocol's handshake and reports; etcd is a recorder of the set written).

RocketMQ 5's master drops a slave from its SyncStateSet as soon as the slave's HA connection goes
(``AutoSwitchHAService.removeConnection``, then alterSyncStateSet at the controller) and adds it
back once a new connection reports an offset at or past the confirm offset
(``maybeExpandInSyncStateSet``).  tidemq kept a restarted slave listed in the etcd set until its
first report on the new connection (or, if it never came back, for ``sync_set_timeout_s``): a
failover meanwhile could elect a replica that came back without acknowledged messages.  The set
still never shrinks below ``min_in_sync_replicas`` (tidemq's rule, issue 25: nothing is
acknowledged without the members then, so a failover to one loses nothing it acknowledged; one
back with a shorter log leaves at its first report), where RocketMQ's would.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from test_controller_ha_reconnect import connect
from test_ha_epoch_wire import E, Rig, ha_options, put, wait_for

from tidemq_controller.sync_set import InSyncTracker
from tidemq_ha_replication.api import GroupTransfer
from tidemq_ha_replication.ha_master import HAServer
from tidemq_ha_replication.wire import REPORT


class Etcd:
    """The election as the tracker uses it: the in-sync sets written, in order."""

    etcd_unconfirmed = False

    def __init__(self) -> None:
        self.written: list[tuple[int, ...]] = []

    async def update_sync_set(self, target: tuple[int, ...]) -> bool:
        self.written.append(target)
        return True

    def stand_down(self) -> None:
        raise AssertionError("the master never loses etcd here")


def test_a_slave_whose_connection_closed_leaves_the_set_until_it_reports_everything(tmp_path: Path) -> None:
    """Three members, ``min_in_sync_replicas`` 2: broker 2 restarts.  It leaves the set (etcd
    first) as its connection closes, not after the timeout; back with less than the set
    acknowledged it stays out; holding everything again, it rejoins."""
    rig = Rig(tmp_path)
    transfer = GroupTransfer()
    socks: list[socket.socket] = []
    try:
        store = rig.store("m")
        # A long timeout: only the disconnection can take the slave out within this test.
        options = SimpleNamespace(
            min_in_sync_replicas=2, sync_set_timeout_s=60.0, slave_fall_behind_max=1 << 30
        )
        tracker = InSyncTracker(1, (1, 2, 3), options, store, transfer)
        server = HAServer(
            store, ha_options(), "127.0.0.1", 0, lambda _o: None, epoch=E, on_slave_ack=tracker.on_slave_ack
        )
        server.start()
        tracker.server = server
        put(store, server, 20)
        end = store.get_max_phy_offset()
        etcd = Etcd()

        def step() -> tuple[int, ...]:
            asyncio.run(tracker.step(etcd))
            return etcd.written[-1] if etcd.written else (1, 2, 3)

        first, third = connect(server.address, 2), connect(server.address, 3)
        socks += [first, third]
        first.sendall(REPORT.pack(end))
        third.sendall(REPORT.pack(end))
        assert wait_for(lambda: tracker.confirm_offset() == end)
        assert step() == (1, 2, 3) and tracker.required == (1, 2, 3)

        # Broker 2 restarts: its connection closes.  It leaves the set, in etcd first, before it
        # connects again (before: still listed, electable, for the 60 s timeout).
        first.close()
        assert wait_for(lambda: len(server.connections) == 1)
        assert wait_for(lambda: step() == (1, 3)), etcd.written
        assert tracker.required == (1, 3) and tracker.confirm_offset() == end

        # Back with a shorter log: connected, reporting, but not back in the set.
        again = connect(server.address, 2)
        socks.append(again)
        again.sendall(REPORT.pack(end // 2))
        assert wait_for(lambda: len(server.connections) == 2)
        for _ in range(5):
            assert step() == (1, 3)
        # Caught up (everything acknowledged): in the set again.
        again.sendall(REPORT.pack(end))
        assert wait_for(lambda: step() == (1, 2, 3)), etcd.written
        assert tracker.required == (1, 2, 3) and tracker.confirm_offset() == end
        assert etcd.written == [(1, 3), (1, 2, 3)]

        # At min_in_sync_replicas the set does not shrink (nothing is acknowledged without the
        # member then): broker 3 leaves, then broker 2 disconnects and stays listed.
        third.close()
        assert wait_for(lambda: step() == (1, 2)), etcd.written
        again.close()
        assert wait_for(lambda: not server.connections)
        for _ in range(5):
            assert step() == (1, 2)  # broker 2 stays listed: the set would fall below two
        assert tracker.confirm_offset() == end
    finally:
        for s in socks:
            s.close()
        transfer.shutdown()
        rig.close()


def test_the_close_of_a_replaced_connection_leaves_the_slave_in_the_set(tmp_path: Path) -> None:
    """A slave that connected again before its old connection's close was noticed is connected:
    its newest connection reports for it, the old one's close changes nothing."""
    rig = Rig(tmp_path)
    transfer = GroupTransfer()
    socks: list[socket.socket] = []
    seen: list[tuple[int, int]] = []
    try:
        store = rig.store("m")
        options = SimpleNamespace(
            min_in_sync_replicas=2, sync_set_timeout_s=60.0, slave_fall_behind_max=1 << 30
        )
        tracker = InSyncTracker(1, (1, 2), options, store, transfer)

        def on_slave_ack(broker_id: int, offset: int) -> Any:
            seen.append((broker_id, offset))
            return tracker.on_slave_ack(broker_id, offset)

        server = HAServer(
            store, ha_options(), "127.0.0.1", 0, lambda _o: None, epoch=E, on_slave_ack=on_slave_ack
        )
        server.start()
        tracker.server = server
        put(store, server, 5)
        end = store.get_max_phy_offset()
        old = connect(server.address, 2)
        socks.append(old)
        old.sendall(REPORT.pack(end))
        assert wait_for(lambda: tracker.confirm_offset() == end)
        new = connect(server.address, 2)
        socks.append(new)
        new.sendall(REPORT.pack(end))
        assert wait_for(lambda: len(server.connections) == 2)
        old.close()
        assert wait_for(lambda: len(server.connections) == 1)
        etcd = Etcd()
        asyncio.run(tracker.step(etcd))
        assert etcd.written == [] and tracker.required == (1, 2), seen
        assert (2, -1) not in seen
    finally:
        for s in socks:
            s.close()
        transfer.shutdown()
        rig.close()
