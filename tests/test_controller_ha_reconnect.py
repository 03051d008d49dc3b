"""A slave's newest HA connection is the one whose reports count (real store, loopback sockets).

The controller's in-sync set keeps each slave's newest report, also when it is lower than the
one before (a slave back with a shorter log).  So the HA server must not pass on a report of a
connection the same broker has replaced since: a late report of the old connection would bring
back an offset the slave no longer holds.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from test_ha_epoch_wire import E, Rig, wait_for

from tidemq_ha_replication.wire import HELLO_MAGIC, REPORT, encode_hello, read_hello_body, recv_exact


def connect(address: tuple[str, int], broker_id: int) -> socket.socket:
    """A slave of epoch E through the handshake (it never reads the stream)."""
    sock = socket.create_connection(address[:2], timeout=5.0)
    sock.sendall(encode_hello({"compression": [], "digest": [], "brokerId": broker_id, "epoch": E}))
    assert recv_exact(sock, len(HELLO_MAGIC)) == HELLO_MAGIC
    reply = read_hello_body(sock)
    assert not reply.get("error"), reply
    return sock


def test_reports_of_a_replaced_connection_are_not_passed_on(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    old = new = None
    try:
        _, server, rec = rig.master(E, n=3)
        old = connect(server.address, 2)
        old.sendall(REPORT.pack(1000))
        assert wait_for(lambda: (2, 1000) in rec.slave_acks)
        # The same broker again (restarted with a shorter log): its report counts, lower or not.
        new = connect(server.address, 2)
        new.sendall(REPORT.pack(500))
        assert wait_for(lambda: (2, 500) in rec.slave_acks)
        old.sendall(REPORT.pack(2000))  # late, from the replaced connection
        new.sendall(REPORT.pack(600))
        assert wait_for(lambda: (2, 600) in rec.slave_acks)
        time.sleep(0.2)
        assert (2, 2000) not in rec.slave_acks, rec.slave_acks
        # The other brokers' connections are their own.
        other = connect(server.address, 3)
        other.sendall(REPORT.pack(700))
        assert wait_for(lambda: (3, 700) in rec.slave_acks)
        other.close()
    finally:
        for sock in (old, new):
            if sock is not None:
                sock.close()
        rig.close()
