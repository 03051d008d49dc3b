"""A NameServer and a broker in subprocesses for the POP tests, a client loop, raw requests."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import Any

import orjson
from conftest import Server, free_port

from tidemq.client import LoopThread, Message, Producer, ReceivedMessage, SimpleConsumer
from tidemq.client.admin import AdminClient
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand

BROKER = "broker-pop"


class PopEnv:
    def __init__(self, tmp: Path, extra: str = "") -> None:
        self.tmp = tmp
        self.servers: list[Server] = []
        ns = Server(["namesrv", "--listen", "127.0.0.1:0"], tmp)
        self.servers.append(ns)
        self.namesrv = ns.addresses["namesrv"]
        self.port = free_port()
        (tmp / "broker.toml").write_text(
            f'[broker]\nname = "{BROKER}"\nlisten = "127.0.0.1:{self.port}"\n'
            f'namesrv = ["{self.namesrv}"]\ndata_dir = "{tmp / "data"}"\n{extra}'
        )
        self.broker_server = self._start_broker()
        self.broker = self.broker_server.addresses["broker"]
        self.loop = LoopThread("test-pop")
        self.consumers: list[SimpleConsumer] = []

    def _start_broker(self) -> Server:
        server = Server(["broker", "-c", str(self.tmp / "broker.toml")], self.tmp)
        self.servers.append(server)
        return server

    def restart(self, sig: int = signal.SIGTERM, between: Any = None) -> None:
        """Stop the broker (SIGTERM: clean; SIGKILL: a crash) and start it again on its data
        (``between()`` runs while it is down)."""
        self.broker_server.stop(sig)
        if between is not None:
            between()
        self.broker_server = self._start_broker()
        assert self.broker_server.addresses["broker"] == self.broker

    def close(self) -> None:
        for c in self.consumers:
            try:
                self.loop.run(c.shutdown(), 10)
            except Exception:
                pass
        self.loop.stop()
        for s in reversed(self.servers):
            s.stop()

    # ------------------------------------------------------------------ helpers
    def send(self, topic: str, n: int, prefix: str, tags: str | None = None) -> list[str]:
        async def go() -> list[str]:
            async with Producer("PG_POP", namesrv=self.namesrv) as p:
                out = []
                for i in range(n):
                    r = await p.send(
                        Message(topic, f"{prefix}-{i}".encode(), tags=tags, keys=f"{prefix}-{i}")
                    )
                    out.append(r.msg_id)
                # The broker registers a topic it auto-created a moment later: wait for its route.
                for _ in range(100):
                    if await p.instance.get_route(topic, refresh=True) is not None:
                        break
                    await asyncio.sleep(0.1)
                return out

        return self.loop.run(go(), 60)

    def consumer(self, group: str, topic: str, expression: str = "*", **kw: Any) -> SimpleConsumer:
        kw.setdefault("consume_from", "first")
        kw.setdefault("await_duration", 0.5)
        c = SimpleConsumer(group, self.namesrv, subscriptions={topic: expression}, **kw)
        self.loop.run(c.start())
        self.consumers.append(c)
        return c

    def receive(
        self, c: SimpleConsumer, n: int = 32, invisible: float = 1.0, wait: float = 0.5
    ) -> list[ReceivedMessage]:
        return self.loop.run(c.receive(n, invisible, wait), 30)

    def receive_all(
        self, c: SimpleConsumer, expect: int, invisible: float = 1.0, timeout: float = 15.0
    ) -> list[ReceivedMessage]:
        got: list[ReceivedMessage] = []
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            got += self.receive(c, 32, invisible, 0.3)
        return got

    def ack(self, c: SimpleConsumer, msgs: list[ReceivedMessage]) -> None:
        for m in msgs:
            self.loop.run(c.ack(m))

    def call(self, code: int, fields: dict[str, Any], body: bytes | None = None) -> RemotingCommand:
        async def go() -> RemotingCommand:
            client = AdminClient(self.namesrv, timeout=15)
            try:
                return await client.call(self.broker, code, fields, body, ok=tuple(range(-1, 1_000_000)))
            finally:
                await client.close()

        return self.loop.run(go(), 30)

    def update_group(self, group: str, **cfg: Any) -> None:
        body = {"groupName": group, "consumeEnable": True, "retryMaxTimes": 16, **cfg}
        resp = self.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, orjson.dumps(body))
        assert resp.code == 0, resp.remark
