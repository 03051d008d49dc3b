"""Broker -> NameServer registration (BrokerOuterAPI): REGISTER_BROKER to every NameServer."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import orjson

from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.replication import MasterAware
from tidemq.tasks import supervise, wait_event

if TYPE_CHECKING:
    from tidemq.context import BrokerContext

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 6.0
RETRY_AFTER_FAILURE_S = 2.0


class NamesrvRegistrar:
    """Registers the broker's topic table with all NameServers, periodically and on change."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self._wanted = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.registered: dict[str, bool] = {}

    def start(self) -> None:
        self._task = supervise(self._loop, "tidemq-namesrv-registration")

    def request(self) -> None:
        """Register soon (coalesces bursts of topic changes into one round)."""
        self._wanted.set()

    async def _loop(self) -> None:
        interval = self.broker.settings.register_interval_s
        while True:
            # A NameServer that could not be reached is retried soon, not a whole interval later.
            wait = interval if all(self.registered.values()) else min(interval, RETRY_AFTER_FAILURE_S)
            await wait_event(self._wanted, wait)
            self._wanted.clear()
            try:
                await self.register_all()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("broker registration failed")

    def _header(self) -> dict[str, Any]:
        b = self.broker
        return {
            "brokerName": b.settings.name,
            "brokerAddr": b.address,
            "clusterName": b.settings.cluster,
            "haServerAddr": b.replication.ha_address() or "",
            # Controller mode: 0 while elected master, the replica's own id while slave.
            "brokerId": b.broker_id,
            "compressed": False,
        }

    async def register_all(self) -> None:
        """One REGISTER_BROKER to each NameServer, in parallel; failures are logged."""
        b = self.broker
        body = orjson.dumps(
            {
                "topicConfigSerializeWrapper": b.topics.serialize(),
                # Live `tidemq filtersrv` processes (processors/filter_server.py).
                "filterServerList": b.filter_servers.addresses(),
            },
            option=orjson.OPT_NON_STR_KEYS,
        )
        header = self._header()

        async def one(addr: str) -> None:
            req = RemotingCommand.request(RequestCode.REGISTER_BROKER, header, body)
            try:
                resp = await b.client.invoke(addr, req, REGISTER_TIMEOUT_S)
            except Exception as exc:
                if self.registered.get(addr, True):
                    log.warning("cannot register with NameServer %s: %s", addr, exc)
                self.registered[addr] = False
                return
            ok = resp.code == ResponseCode.SUCCESS
            if not ok:
                log.warning("NameServer %s refused registration: %s %s", addr, resp.code, resp.remark)
            elif not self.registered.get(addr):
                log.info("registered with NameServer %s as %s", addr, b.address)
            self.registered[addr] = ok
            # HA (issue 7): a slave learns its master's addresses from the registration answer.
            if ok and isinstance(b.replication, MasterAware) and resp.ext_fields:
                b.replication.update_master(
                    resp.ext_fields.get("haServerAddr", ""), resp.ext_fields.get("masterAddr", "")
                )

        await asyncio.gather(*(one(a) for a in b.settings.namesrv))

    async def unregister_all(self) -> None:
        b = self.broker
        header = {
            k: v
            for k, v in self._header().items()
            if k in ("brokerName", "brokerAddr", "clusterName", "brokerId")
        }

        async def one(addr: str) -> None:
            req = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, header)
            try:
                await b.client.invoke(addr, req, 3.0)
            except Exception as exc:
                log.info("cannot unregister from NameServer %s: %s", addr, exc)

        await asyncio.gather(*(one(a) for a in b.settings.namesrv))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
