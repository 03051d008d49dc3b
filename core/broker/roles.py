"""Following a role the replication decides at run time (controller mode, issue 25).

A :class:`~tidemq.replication.RoleAware` replication promotes or demotes the broker while it
runs.  :class:`RoleFollower` hears each change (from any thread), hops to the broker's loop, logs
the new role, starts or stops the services only a master runs (delayed-message and timer
delivery, the transaction check), and registers with every NameServer at once, so the new master
is brokerId 0 there within a round trip instead of a registration period.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from tidemq.replication import RoleAware

if TYPE_CHECKING:
    from tidemq.context import BrokerContext

log = logging.getLogger(__name__)


class MasterOnlyService(Protocol):
    """A service only a master runs (delayed-message and timer delivery, the transaction check)."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


class RoleFollower:
    """Applies a :class:`~tidemq.replication.RoleAware` replication's role changes to one broker."""

    def __init__(
        self, broker: BrokerContext, role_aware: RoleAware, master_only: Sequence[MasterOnlyService]
    ) -> None:
        self.broker = broker
        self.role_aware = role_aware
        #: Started when the broker becomes master, stopped when it stops being one, in this order.
        self.master_only = tuple(master_only)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        # The role the master-only services were last started for, and the last role logged.
        self._services_master = False
        self._last: tuple[str, int, int] | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Before the replication starts: a role it takes while starting is not missed."""
        self._loop = loop
        self.role_aware.bind_role_listener(self._listener)

    def started(self) -> None:
        """The broker starts its services for the role in force now (synchronously, on the loop)."""
        self._services_master = self.broker.is_master
        self._last = self._now()

    def _now(self) -> tuple[str, int, int]:
        r = self.role_aware
        return r.current_role(), r.current_broker_id(), r.current_epoch()

    def _listener(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._changed)
        except RuntimeError:  # the loop closed meanwhile: the broker is gone
            pass

    def _changed(self) -> None:
        if self.broker.running:
            self.broker.spawn(self.follow())

    async def follow(self) -> None:
        """Log the new role, start or stop the master-only services, tell the NameServers."""
        b = self.broker
        async with self._lock:  # changes in a row are applied in order, one at a time
            if not b.running:
                return
            now = self._now()
            if now != self._last:
                self._last = now
                log.info("%s is now %s, epoch %d", b.settings.name, now[0], now[2])
            # The NameServers first, not after the services stopped (a flush of their progress
            # may take a while), and once more after any round already on its way (old id).
            registering = asyncio.ensure_future(b.registrar.register_all())
            b.registrar.request()
            master = b.is_master
            if master != self._services_master:
                self._services_master = master
                if master:
                    for service in self.master_only:
                        service.start()
                else:  # each also checks is_master before each write it makes
                    for service in self.master_only:
                        await service.stop()
            try:
                await registering
            except Exception:
                log.exception("registration after a role change failed")
