"""REGISTER_FILTER_SERVER (RocketMQ's FilterServerManager on the broker side).

A filter server (``tidemq filtersrv``) registers with its broker every few seconds; the broker
lists the live ones in ``filterServerList`` when it registers with the NameServers, which serve
them to consumers in the route's ``filterServerTable``.  A filter server whose connection closes,
or which has not registered for :data:`FILTER_SERVER_MAX_IDLE_S`, is dropped.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from tidemq.broker.context import ProcessorRegister
from tidemq.broker.headers import Header, kv
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection

if TYPE_CHECKING:
    from tidemq.broker.context import BrokerContext
    from tidemq.broker.services import BrokerServices

log = logging.getLogger(__name__)

FILTER_SERVER_MAX_IDLE_S = 30.0  # RocketMQ's FILTER_SERVER_MAX_IDLE_TIME_MILLS


class FilterServerManager:
    """Live filter servers of this broker, by connection."""

    def __init__(self, broker: BrokerContext):
        self.broker = broker
        self._table: dict[Any, tuple[str, float]] = {}

    def addresses(self) -> list[str]:
        now = time.monotonic()
        for conn, (addr, seen) in list(self._table.items()):
            if now - seen > FILTER_SERVER_MAX_IDLE_S or conn.closed:
                log.info("filter server %s expired", addr)
                self._table.pop(conn, None)
        return sorted({addr for addr, _ in self._table.values()})

    async def register(self, conn: Connection, request: RemotingCommand) -> RemotingCommand:
        b = self.broker
        addr = Header(request.ext_fields, "REGISTER_FILTER_SERVER").str("filterServerAddr")
        known = conn in self._table and self._table[conn][0] == addr
        self._table[conn] = (addr, time.monotonic())
        if not known:
            log.info("filter server registered: %s", addr)
            conn.add_close_callback(self._closed)
            b.registrar.request()  # tell the NameServers now, not at the next periodic round
        return request.reply(ResponseCode.SUCCESS, None, kv(brokerName=b.settings.name, brokerId=b.broker_id))

    def _closed(self, conn: Connection) -> None:
        entry = self._table.pop(conn, None)
        if entry is not None:
            log.info("filter server %s disconnected", entry[0])
            if self.broker.running:
                self.broker.registrar.request()


def register(register: ProcessorRegister, services: BrokerServices) -> None:
    register.add(RequestCode.REGISTER_FILTER_SERVER, register.context.filter_servers.register)
