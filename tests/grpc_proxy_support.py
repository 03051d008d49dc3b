"""A cluster for ``tidemq proxy`` tests: a NameServer, two broker groups (broker-a, broker-b) and
the proxy in front, all real ``python -m tidemq`` processes (the ``spawn`` fixture)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import free_port, wait_for

from tidemq.client import BlockingPullConsumer, PullStatus
from tidemq.client.admin import AdminClient

BROKERS = ("broker-a", "broker-b")


class ProxyCluster:
    def __init__(self, spawn: Any, tmp_path: Path, broker_toml: str = "", proxy_toml: str = "") -> None:
        self.tmp = tmp_path
        self.spawn = spawn
        self.namesrv_server = spawn("namesrv", "--listen", "127.0.0.1:0")
        self.namesrv = self.namesrv_server.addresses["namesrv"]
        self.brokers: dict[str, Any] = {}
        self.addresses: dict[str, str] = {}
        starts: dict[str, tuple[str, ...]] = {}
        for name in BROKERS:
            conf = tmp_path / f"{name}.toml"
            conf.write_text(
                "[broker]\n"
                f'name = "{name}"\n'
                f'listen = "127.0.0.1:{free_port()}"\n'
                f'namesrv = ["{self.namesrv}"]\n'
                f'data_dir = "{tmp_path / name}"\n' + broker_toml
            )
            starts[name] = ("broker", "-c", str(conf))
        # The two brokers start side by side (each start is mostly the interpreter's imports); the
        # proxy after them, so that ``spawn`` stops it first: a broker stopped while the proxy still
        # holds requests on it takes seconds longer to go.
        with concurrent.futures.ThreadPoolExecutor(len(starts)) as pool:
            started = dict(zip(starts, pool.map(lambda args: spawn(*args), starts.values()), strict=True))
        for name in BROKERS:
            self.brokers[name] = started[name]
            self.addresses[name] = self.brokers[name].addresses["broker"]
        (tmp_path / "proxy.toml").write_text("[proxy]\n" + proxy_toml)
        self.proxy_server = spawn(
            "proxy", "-c", str(tmp_path / "proxy.toml"), "--namesrv", self.namesrv, "--listen", "127.0.0.1:0"
        )
        self.proxy = self.proxy_server.addresses["proxy"]
        self.env = {**os.environ, "HOME": str(tmp_path)}

    def admin(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", *args, "-n", self.namesrv],
            capture_output=True,
            text=True,
            timeout=60,
            env=self.env,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout

    def create_topic(self, topic: str, *options: str, queues: int = 4) -> None:
        """``topic`` on both broker groups, once the NameServer routes it to both."""
        self.admin("updateTopic", "-t", topic, "-r", str(queues), "-w", str(queues), *options)
        # The route, asked in-process (a ``tidemq admin topicRoute`` process per look cost ~1 s each).
        assert wait_for(lambda: routed_brokers(self.namesrv, topic) >= set(BROKERS), 30), self.admin(
            "topicRoute", "-t", topic
        )


def routed_brokers(namesrv: str, topic: str) -> set[str]:
    """The broker names the NameServer routes ``topic`` to (GET_ROUTEINFO_BY_TOPIC), from a thread of
    its own so a caller inside an event loop can ask too."""

    async def ask() -> set[str]:
        client = AdminClient(namesrv)
        try:
            route = await client.route(topic)
        finally:
            await client.close()
        return {b.broker_name for b in route.broker_datas}

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, ask()).result(30)


def drain(namesrv: str, topic: str, group: str) -> dict[bytes, str]:
    """body -> broker name of every message of ``topic``, pulled from offset 0 through the route."""
    got: dict[bytes, str] = {}
    consumer = BlockingPullConsumer(group, namesrv)
    consumer.start()
    try:
        for mq in consumer.fetch_subscribe_queues(topic):
            offset = 0
            while True:
                res = consumer.pull(mq, "*", offset, 64)
                if res.status is not PullStatus.FOUND:
                    break
                got.update((m.body, mq.broker_name) for m in res.messages)
                offset = res.next_begin_offset
    finally:
        consumer.shutdown()
    return got
