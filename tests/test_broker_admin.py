"""``tidemq admin`` against a NameServer and a broker started with the command line."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import run_admin

pytestmark = pytest.mark.timeout(120)


class Admin:
    def __init__(self, namesrv: str, cwd: Path):
        self.namesrv, self.cwd = namesrv, cwd

    def __call__(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return run_admin(self.namesrv, *args, cwd=self.cwd, ok=ok, timeout=30)


@pytest.fixture
def cluster(spawn: Any, tmp_path: Path, port: int) -> tuple[Admin, str, str]:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the two NameServers start side by side
        ns_a, ns_b = pool.map(
            lambda _: spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"], "ab"
        )
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nname = "broker-x"\ncluster = "C1"\nlisten = "127.0.0.1:{port}"\n'
        f'namesrv = ["{ns_a}", "{ns_b}"]\ndata_dir = "{tmp_path / "data"}"\n'
    )
    broker = spawn("broker", "-c", str(tmp_path / "broker.toml")).addresses["broker"]
    return Admin(f"{ns_a};{ns_b}", tmp_path), broker, ns_b


def test_topic_lifecycle_and_messages(cluster: tuple[Admin, str, str]) -> None:
    admin, broker, ns_b = cluster
    out = admin("updateTopic", "-t", "Orders", "-r", "2", "-w", "2").stdout
    assert f"create topic to {broker} success." in out
    # The broker registered the topic with both NameServers.
    for ns in admin.namesrv.split(";"):
        route = json.loads(Admin(ns, admin.cwd)("topicRoute", "-t", "Orders").stdout)
        assert route["queueDatas"] == [
            {"brokerName": "broker-x", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
        ]
        assert route["brokerDatas"][0]["brokerAddrs"] == {"0": broker}
    assert "Orders" in admin("topicList").stdout.split()
    cluster_out = admin("clusterList").stdout
    assert "C1" in cluster_out and "broker-x" in cluster_out and broker in cluster_out

    sent = admin(
        "sendMessage", "-t", "Orders", "-p", "hello admin", "-k", "order-42", "-c", "paid", "-i", "1"
    ).stdout
    uniq_id, offset_id = sent.strip().splitlines()[-1].split()[-2:]
    status = admin("topicStatus", "-t", "Orders").stdout
    rows = [line.split()[:4] for line in status.splitlines()[1:]]
    assert rows == [["broker-x", "0", "0", "0"], ["broker-x", "1", "0", "1"]]
    by_id = admin("queryMsgById", "-i", offset_id).stdout
    assert "Message Body:        hello admin" in by_id and "Tags:                [paid]" in by_id
    by_uniq = admin("queryMsgById", "-i", uniq_id, "-t", "Orders").stdout  # the producer's id: via the index
    assert f"OffsetID:            {offset_id}" in by_uniq
    by_key = admin("queryMsgByKey", "-t", "Orders", "-k", "order-42").stdout
    assert offset_id in by_key
    consumed = admin("consumeMessage", "-t", "Orders").stdout
    assert "body=hello admin" in consumed and "1 message(s)" in consumed

    admin("deleteTopic", "-t", "Orders")
    assert "Orders" not in admin("topicList").stdout.split()
    missing = admin("topicRoute", "-t", "Orders", ok=False)
    assert missing.returncode == 1 and "no route for topic 'Orders'" in missing.stderr


def test_admin_errors_are_one_line(cluster: tuple[Admin, str, str], tmp_path: Path) -> None:
    admin, _, _ = cluster
    bad = admin("queryMsgById", "-i", "not-an-id", ok=False)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "not an offset message id" in bad.stderr
    nobody = Admin("127.0.0.1:1", tmp_path)("topicList", ok=False)
    assert nobody.returncode == 1 and "did not answer" in nobody.stderr
    progress = admin("consumerProgress", "-g", "NoSuchGroup", ok=False)
    assert progress.returncode == 1 and "NoSuchGroup" in progress.stderr
