"""A SYNC master's in-sync replica set (RocketMQ 5's SyncStateSet): who must hold a send, and its upkeep.

The rule that makes failover lossless without an etcd write per acknowledgement:

- a send is acknowledged only when **every** other member of the set has reported its end on the
  HA stream (and only while the set has at least ``min_in_sync_replicas`` members);
- only a member may win a campaign (:meth:`Election.campaign`), and a candidate stops following
  its master before it campaigns, so a deposed master can no longer collect a full set of
  acknowledgements;
- the set changes only through etcd, in the safe order: a member is **removed** in etcd first and
  only then stops being waited for; a member is **added** locally first (waited for at once) and
  then written to etcd, and only once it holds everything acknowledged so far.

So every member of the set in etcd holds every acknowledged message, whoever wins holds them all,
and a master cut off from etcd keeps acknowledging only while its whole set follows it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tidemq.replication import ReplicaStatus
from tidemq_ha_replication.api import GroupTransfer, HAConnection, HAServer

from .etcd import ControllerError

log = logging.getLogger(__name__)

__all__ = ["InSyncTracker"]

#: How often the set is looked after (s): removals wait sync_set_timeout_s anyway.
TICK_S = 0.25


class InSyncTracker:
    """The in-sync set of the master ``me`` (broker ids, master included) for one mastership.

    ``options`` gives ``min_in_sync_replicas``, ``sync_set_timeout_s`` and ``slave_fall_behind_max``;
    ``transfer`` holds the sends waiting for the set.  ``server`` (the HA server, set once it
    listens) lists the connected slaves with their broker id, acknowledged offset and the last time
    they caught up.  HA reader threads call :meth:`on_slave_ack`; :meth:`maintain` runs on the loop.
    """

    def __init__(
        self,
        me: int,
        members: tuple[int, ...],
        options: Any,
        store: Any,
        transfer: GroupTransfer,
    ) -> None:
        self.me = me
        self.options = options
        self.store = store
        self.transfer = transfer
        self.server: HAServer | None = None
        #: Members waited for (master included); :attr:`written` is what etcd holds.
        self.required: tuple[int, ...] = tuple(sorted({*members, me}))
        self.written: tuple[int, ...] = self.required
        #: Each slave's end as its newest report says (per broker, across its connections).
        self._acks: dict[int, int] = {}
        #: Members that came back without a message the set acknowledged: removed from the set
        #: (etcd first) even below ``min_in_sync_replicas``, unless they catch up before.
        self._lost: set[int] = set()
        #: Members whose HA connection closed (a restart, a crash, the network) and that have not
        #: reported on a new one: removed from the set (etcd first) at once while it stays at
        #: least ``min_in_sync_replicas``, as RocketMQ 5's AutoSwitchHAService.removeConnection
        #: removes them; they rejoin as any slave does, once a new connection reports everything
        #: acknowledged.  Before, a restarted slave stayed listed (electable) until its first
        #: report or the timeout, though it may have come back without acknowledged messages.
        self._gone: set[int] = set()
        self._lock = threading.Lock()
        self._since = time.monotonic()  # members of the starting set get a timeout to reconnect
        self._seen: dict[int, float] = {}  # member -> last time it was caught up (or added)
        self._failed_write = False
        #: A member gone longer than the timeout is still in the set (refreshed every tick, so
        #: the send path reads a flag instead of walking the connections).
        self.blocked = False
        #: Called (under the lock, from an HA reader thread or the loop) after the confirm offset
        #: (``transfer.acked``: what every other member holds) grew: held reads re-check.
        self.on_confirm: Callable[[], None] | None = None

    # ------------------------------------------------------------------ acknowledgements
    def on_slave_ack(self, broker_id: int, offset: int) -> None:
        """Slave ``broker_id`` holds the log up to ``offset`` (-1: its connection closed).

        The newest report counts, also when it is lower than the last one: a slave reports its
        end on every connection, and one that comes back with less (restarted after a crash with
        async flush, or after its log was cut) no longer holds what it acknowledged before
        (RocketMQ 5 keeps ``slaveAckOffset`` per connection, set by each report).  Keeping the old
        offset would let the other members' acknowledgements confirm what it does not hold, and
        count it in sync.  The confirm offset itself never goes back (what readers saw and
        producers were told stays acknowledged); a member below it has lost acknowledged
        messages and leaves the set (:meth:`_plan`) until it holds them again.
        """
        if offset < 0:
            with self._lock:
                # Its report was of the connection that closed: a new one reports afresh (what it
                # holds after a restart is unknown until then; RocketMQ's confirm offset stops
                # growing too while a member has no connection).
                self._acks.pop(broker_id, None)
                if broker_id in self.required and broker_id != self.me:
                    self._gone.add(broker_id)
            log.info("in-sync set: broker %d disconnected", broker_id)
            return
        with self._lock:
            before = self._acks.get(broker_id, -1)
            if offset == before:
                return
            self._acks[broker_id] = offset
            self._gone.discard(broker_id)  # connected again: its report says what it holds
            acked = self.transfer.acked
            # (A first report after a disconnection has no report before it to be lower than.)
            lost = broker_id in self.required and offset < acked
            if lost:
                self._lost.add(broker_id)
            elif offset > before:
                self._ack_locked()
                return
        log.warning(
            "in-sync set: broker %d reports %d, less than %s%s",
            broker_id,
            offset,
            f"the {before} it reported before" if before >= 0 else "what the set acknowledged",
            f" (the confirm offset {acked}): it lost acknowledged messages" if lost else "",
        )

    def _floor_locked(self) -> int | None:
        """The offset every other member holds (None: a member has reported nothing yet)."""
        others = [b for b in self.required if b != self.me]
        if len(self.required) < self.options.min_in_sync_replicas or not others:
            return None
        floor = min(self._acks.get(b, -1) for b in others)
        return floor if floor >= 0 else None

    def _ack_locked(self) -> None:
        # Under the lock: an addition decided meanwhile must not let an older floor through.
        floor = self._floor_locked()
        if floor is not None and floor > self.transfer.acked:
            self.transfer.ack(floor)
            listener = self.on_confirm
            if listener is not None:
                listener()

    def confirm_offset(self) -> int | None:
        """What every other member holds (RocketMQ 5's confirmOffset); None while the set is only
        the master (it acknowledges alone: everything stored is confirmed)."""
        if len(self.required) == 1:
            return None
        return self.transfer.acked

    def precheck(self, end_offset: int) -> ReplicaStatus | None:
        """An answer without waiting (None: wait for the set to acknowledge ``end_offset``)."""
        required = self.required
        if len(required) < self.options.min_in_sync_replicas:
            return ReplicaStatus.SLAVE_NOT_AVAILABLE
        if len(required) == 1:  # min_in_sync_replicas = 1 and nobody else in sync
            with self._lock:
                if len(self.required) == 1:
                    # Recorded as acknowledged: a slave joining later must hold it too.
                    self.transfer.ack(end_offset)
                    return ReplicaStatus.PUT_OK
        if self.blocked:
            return ReplicaStatus.SLAVE_NOT_AVAILABLE  # a member gone this long is still in the set
        floor = min(self._acks.get(b, 0) for b in required if b != self.me)
        if self.store.get_max_phy_offset() - floor > self.options.slave_fall_behind_max:
            return ReplicaStatus.SLAVE_NOT_AVAILABLE
        return None

    def unsatisfiable(self) -> bool:
        """A member of the set has been disconnected longer than the timeout (sends cannot succeed)."""
        now = time.monotonic()
        live = self._live()
        return any(
            b != self.me and b not in live and now - max(self._seen.get(b, 0.0), self._since) > self._timeout
            for b in self.required
        )

    # ------------------------------------------------------------------ upkeep
    @property
    def _timeout(self) -> float:
        return float(self.options.sync_set_timeout_s)

    def _live(self) -> dict[int, HAConnection]:
        """Connected slaves of this epoch by broker id (the freshest connection of each)."""
        server = self.server
        live: dict[int, HAConnection] = {}
        if server is None:
            return live
        for conn in list(server.connections):
            bid = conn.broker_id
            if bid is None or conn.closed.is_set():
                continue
            if bid not in live or conn.caught_up_at > live[bid].caught_up_at:
                live[bid] = conn
        return live

    def _plan(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Apply additions locally; return (members to remove, the set to write)."""
        now = time.monotonic()
        live = self._live()
        with self._lock:
            end = self.store.get_max_phy_offset()
            for bid, conn in live.items():
                # Caught up: at our end now (an idle slave reports only every heartbeat), or it
                # reached the end we had when it last caught up (a busy one never sits at the end).
                seen = now if conn.ack_offset >= end else conn.caught_up_at
                if seen:
                    self._seen[bid] = max(self._seen.get(bid, 0.0), seen)
            acked = self.transfer.acked
            added = False
            for bid in sorted(live):
                if bid in self.required or bid == self.me:
                    continue
                # Holds everything acknowledged so far and keeps pace: waited for from now on.
                if self._acks.get(bid, -1) >= acked and now - self._seen.get(bid, 0.0) < self._timeout:
                    self.required = tuple(sorted({*self.required, bid}))
                    self._seen[bid] = now
                    added = True
                    log.info(
                        "in-sync set: broker %d caught up (at %d); now waiting for %s",
                        bid,
                        acked,
                        self.required,
                    )
            if added:
                # The members acknowledged before they were waited for (an idle slave reports no
                # more): what the set holds now is the confirm offset (held reads wake), not the
                # acknowledgement of the set before (the master alone: SLAVE_NOT_AVAILABLE sends).
                self._ack_locked()
            lagging = sorted(
                (self._seen.get(b, self._since), b)
                for b in self.required
                if b != self.me and now - max(self._seen.get(b, 0.0), self._since) > self._timeout
            )
            room = len(self.required) - self.options.min_in_sync_replicas
            # Disconnected members first, at once (RocketMQ 5's removeConnection), then those
            # lagging past the timeout; never below min_in_sync_replicas (nothing is acknowledged
            # without them then, so they hold everything acknowledged, unless a crash cut their
            # log: their first report says so, and they leave as lost below).
            self._gone &= set(self.required)
            order = sorted(self._gone) + [b for _, b in lagging if b not in self._gone]
            remove = set(order[: max(0, room)])
            # A member without everything acknowledged must not stay electable, whatever the
            # room: a failover to it would cut acknowledged messages (sends wait for it anyway).
            self._lost = {b for b in self._lost if b in self.required and self._acks.get(b, -1) < acked}
            remove |= self._lost
            target = tuple(b for b in self.required if b not in remove)
            return tuple(sorted(remove)), target

    async def step(self, election: Any) -> None:
        """One round: add caught-up slaves, drop members lagging past the timeout, sync etcd.

        A master serving without etcd whose set has lost a member for the timeout steps down
        until etcd answers: it can acknowledge nothing, and it would stay registered as the
        group's master beside the one the others may have elected meanwhile.
        """
        self.blocked = self.unsatisfiable()
        if self.blocked and election.etcd_unconfirmed:
            log.warning(
                "in-sync set %s has lost a member and etcd is unreachable: stepping down until etcd answers",
                self.required,
            )
            election.stand_down()
            return
        remove, target = self._plan()
        if target == self.written:
            return
        try:
            ok = await election.update_sync_set(target)
        except ControllerError as exc:
            if not self._failed_write:
                log.warning(
                    "in-sync set %s not written (etcd unreachable: %s); unchanged until it is", target, exc
                )
            self._failed_write = True
            return
        self._failed_write = False
        #: A member gone longer than the timeout is still in the set (refreshed every tick, so
        #: the send path reads a flag instead of walking the connections).
        self.blocked = False
        if not ok:
            return  # deposed: update_sync_set fenced us
        self.written = target
        if remove:
            with self._lock:
                self.required = tuple(b for b in self.required if b not in remove)
                self._gone -= set(remove)
                self._ack_locked()
                listener = self.on_confirm
                if listener is not None and len(self.required) == 1:
                    listener()  # the master alone: no bound any more
            log.warning(
                "in-sync set: brokers %s fell behind for %.1f s, lost acknowledged messages or disconnected;"
                " set is now %s",
                list(remove),
                self._timeout,
                target,
            )

    async def maintain(self, election: Any) -> None:
        """Run :meth:`step` every :data:`TICK_S` until cancelled (at demotion)."""
        while True:
            try:
                await self.step(election)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("in-sync set upkeep failed")
            await asyncio.sleep(TICK_S)
