"""Topic metadata across a controller failover (issue 25): what a new master knows of its topics.

Slaves copy the master's topic configs every ``metadata_sync_s``; a topic created (and written)
after the last copy exists on a slave only as replicated messages.  The new master adopts such
topics from its commit log before it registers as master, so producers and consumers find them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import run_admin, wait_for

pytest.importorskip("httpx", reason="httpx is not installed (pip install tidemq[controller])")

from controller_support import ControllerCluster, EtcdServer, etcd_fixture, read_all  # noqa: E402,F401  (the etcd fixture)

from tidemq.client import BlockingProducer, Message, SendStatus  # noqa: E402

FRESH = "FreshTopic"


@pytest.mark.slow
def test_a_topic_created_after_the_last_metadata_sync_is_served_by_the_new_master(
    spawn: Any,
    tmp_path: Path,
    etcd: EtcdServer,  # noqa: F811
) -> None:
    # Slaves copy topic configs at start only (the next copy is a minute away).
    cluster = ControllerCluster(spawn, tmp_path, etcd, options={"metadata_sync_s": 60.0})
    master = cluster.wait_master()
    assert wait_for(lambda: master.info().get("haConnectedSlaves") == "2", 20), master.log()
    run_admin(cluster.ns, "updateTopic", "-t", FRESH, "-b", master.addr, "-w", "4", "-r", "4", cwd=tmp_path)
    producer = BlockingProducer("fresh-p", cluster.ns, retry_times=0)
    producer.start()
    try:
        acked = []
        for i in range(40):
            result = producer.send(Message(FRESH, b"fresh-%d" % i))
            assert result.status is SendStatus.SEND_OK, result
            acked.append(b"fresh-%d" % i)
    finally:
        producer.shutdown()
    master.kill()
    new = cluster.wait_master(15)
    assert new is not master
    assert "adopts topic FreshTopic" in new.full_log()
    # The route names the new master for the topic, and every acknowledged message is readable.
    assert wait_for(
        lambda: sorted(b for bodies in read_all(cluster.ns, FRESH).values() for b in bodies) == sorted(acked),
        20,
    )
