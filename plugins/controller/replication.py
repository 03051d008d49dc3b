"""The ``controller`` replication: master_slave's HA stream, with the master elected through etcd.

Every replica of a group registers in etcd (:class:`~.election.Election`); when the group has no
master, a replica campaigns with its commit-log end and the winner of epoch *E* records ``(E,
end)`` in its :class:`~.epochs.EpochFile`, serves the HA port and becomes the broker's master
(brokerId 0 at the NameServers through the role listener).  The others follow the leader's HA
address as slaves, after truncating their log to the point where it agrees with the new master's
(:func:`~.epochs.consistent_point` against the epoch history kept in etcd).

Under SYNC_MASTER the group keeps an in-sync set in etcd (RocketMQ 5's SyncStateSet, see
:mod:`.sync_set`): a send is acknowledged only when every other member of the set holds its bytes,
only members may be elected, and the set changes only through etcd, so whoever wins holds every
acknowledged message, and no etcd write sits on the acknowledgement path.  The HA stream carries
the epoch: a slave follows only the master of the epoch it knows, a master serves only slaves of
its epoch, and a slave of a newer epoch fences it.

:class:`ControllerReplication` **subclasses** ha_replication's public
:class:`~tidemq_ha_replication.api.MasterSlaveReplication` rather than wrapping one.  Controller
mode *is* master_slave with an elected role: the same HA server, client and group transfer
(swapped at run time as the election decides), the same options (``ControllerOptions`` extends
``MasterSlaveOptions``), the same runtime-info keys, slave metadata copy and shutdown.  Composition
would forward every contract method and still share that mutable state, so it would hide the
coupling rather than remove it.  The base class declares its extension points (public attributes
and methods, listed in :mod:`tidemq_ha_replication.master_slave`); this class uses only those and
the names of :mod:`tidemq_ha_replication.api`, and inherits
:meth:`~tidemq_ha_replication.api.MasterSlaveReplication.follow_metadata` (a replica copies its
master's metadata while it follows one; :meth:`_serve` stops the copy when it is promoted).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any

from tidemq.errors import ConfigError
from tidemq.replication import ReplicaStatus
from tidemq.store import TruncatableStore
from tidemq_ha_replication.api import (
    GroupTransfer,
    HAClient,
    HAServer,
    MasterSlaveReplication,
    broker_setting,
    completed,
)

from .election import Election, ElectionConfig, FenceReason, MasterState, Member
from .epochs import EpochEntry, EpochFile, EpochFileError, consistent_point
from .etcd import ControllerError, EtcdClient
from .options import ControllerOptions, check_broker_settings
from .status import GroupStatus, cluster_status
from .sync_set import InSyncTracker

log = logging.getLogger(__name__)

_NOT_MASTER: Future[ReplicaStatus] = completed(ReplicaStatus.NOT_MASTER)
RETRY_S = 0.5  # pause before re-reading the group after a failed step


class ControllerReplication(MasterSlaveReplication):
    """One replica of an elected group; ``self.role`` is the role it takes when elected."""

    def __init__(self, options: ControllerOptions) -> None:
        super().__init__(options)
        self.copts = options
        self._role = "SLAVE"
        self._epoch = 0
        self._listener: Callable[[], None] | None = None
        self.broker_id = 1
        self.election: Election | None = None
        self.etcd: EtcdClient | None = None
        self.epochs: EpochFile | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._following: tuple[int, int, str] | None = None  # (epoch, master id, HA address)
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[Any]] = []
        self._reporter: asyncio.Task[None] | None = None
        self.in_sync: InSyncTracker | None = None  # SYNC master: who must hold a send
        self._status: GroupStatus | None = None
        self._retry: asyncio.TimerHandle | None = None
        self.failovers = 0
        self._won_sync_set: tuple[int, ...] = ()
        self._confirm_listener: Callable[[], None] | None = None
        #: The last confirm offset of a replica between masters (a deposed SYNC master's own, a
        #: slave's from the master it stopped following): its reads stay bounded by it until it
        #: follows a master (after cutting what that master's epochs do not hold) or is promoted.
        self._fenced_confirm: int | None = None

    # ------------------------------------------------------------------ RoleAware
    def current_role(self) -> str:
        return self._role

    def current_broker_id(self) -> int:
        return 0 if self._role != "SLAVE" else self.broker_id

    def current_epoch(self) -> int:
        return self._epoch

    def bind_role_listener(self, listener: Callable[[], None]) -> None:
        self._listener = listener

    def _role_changed(self) -> None:
        if self._listener is not None:
            try:
                self._listener()
            except Exception:
                log.exception("role listener failed")

    # ------------------------------------------------------------------ ConfirmsReads
    def confirm_offset(self) -> int | None:
        """What every member of the in-sync set holds, else None (no bound).

        RocketMQ 5's CommitLog.getConfirmOffset in controller mode with allAckInSyncStateSet:
        on a SYNC master the whole set's acknowledgement (None when the set is the master alone:
        it confirms everything stored); on a slave the master's, as the HA stream last carried it
        (a deposed master: its own last one until it follows the new master); None with
        ``read_uncommitted``, on ASYNC groups, and on a slave before its master sent one.
        """
        if self.copts.read_uncommitted:
            return None
        tracker = self.in_sync
        if tracker is not None and self._role != "SLAVE":
            return tracker.confirm_offset()
        if self._fenced_confirm is not None:
            return self._fenced_confirm
        client = self.client
        if client is not None and client.confirm_offset >= 0:
            return client.confirm_offset
        return None

    def bind_confirm_listener(self, listener: Callable[[], None]) -> None:
        self._confirm_listener = listener

    def _confirm_advanced(self) -> None:
        if self.copts.read_uncommitted:
            return  # nobody reads by it
        server = self.server
        if server is not None:
            server.notify_confirm()  # the HA writers send the new confirm offset to the slaves
        listener = self._confirm_listener
        if listener is not None:
            try:
                listener()
            except Exception:
                log.exception("confirm listener failed")

    # ------------------------------------------------------------------ contract
    def start(self, store: Any, broker_config: Any) -> None:
        if not isinstance(store, TruncatableStore):
            raise ConfigError(
                f"[replication.controller] needs a store with raw commit-log access and truncation; "
                f"{type(store).__name__} has none"
            )
        role = str(broker_setting(broker_config, "role", "SYNC_MASTER"))
        broker_id = int(broker_setting(broker_config, "id", 0))
        check_broker_settings(role, broker_id)
        if not self.copts.extended:
            raise ConfigError(
                "[replication.controller] extended = false: controller mode needs tidemq's HA handshake "
                "(the epoch travels in it)"
            )
        self.store, self.role, self.broker_id = store, role, broker_id
        config = election_config(self.copts, role)
        store_path = broker_setting(broker_config, "store_path", None)
        if store_path is None:
            raise ConfigError("[replication.controller] needs the broker's data directory")
        try:
            self.epochs = EpochFile(store_path / "epoch")
        except EpochFileError as exc:
            raise ConfigError(str(exc)) from None
        self._ha_listen = self.listen_address(broker_config)
        host, port = self._ha_listen
        addr = str(
            broker_setting(broker_config, "advertise", "") or broker_setting(broker_config, "listen", "")
        )
        addr_host, _, addr_port = addr.rpartition(":")
        wildcards = ("0.0.0.0", "::", "[::]", "")
        if host in wildcards or addr_host in wildcards:
            from tidemq.message import local_ip  # what the other replicas can reach

            host = local_ip() if host in wildcards else host
            addr = f"{local_ip()}:{addr_port}" if addr_host in wildcards else addr
        me = Member(broker_id, addr, f"{host}:{port}", store.get_max_phy_offset(), self._last_epoch())
        self.etcd = EtcdClient(self.copts.etcd, self.copts.request_timeout_s)
        self.election = Election(
            self.etcd,
            str(broker_setting(broker_config, "cluster", "DefaultCluster")),
            str(broker_setting(broker_config, "name", "broker-a")),
            me,
            config,
            on_fenced=self._on_fenced,
            on_resumed=self._on_resumed,
        )
        self.loop = asyncio.get_running_loop()
        self._tasks.append(self.loop.create_task(self._run(), name="tidemq-controller"))
        self._tasks.append(self.loop.create_task(self._report_loop(), name="tidemq-controller-report"))
        log.info(
            "controller replica %d of %s: joining the election at %s", broker_id, me.addr, self.copts.etcd
        )

    def _last_epoch(self) -> int:
        last = self.epochs.last if self.epochs is not None else None
        return last.epoch if last is not None else 0

    def wait_for_replicas(self, end_offset: int) -> Future[ReplicaStatus]:
        election, server = self.election, self.server
        if self._role == "SLAVE" or election is None or not election.is_master or server is None:
            return _NOT_MASTER
        server.notify_data()
        tracker, transfer = self.in_sync, self.transfer
        if tracker is None or transfer is None:
            return completed(ReplicaStatus.PUT_OK)  # ASYNC_MASTER
        status = tracker.precheck(end_offset)
        if status is not None:
            return completed(status)
        return transfer.wait(end_offset, self.options.sync_timeout_s)

    def update_master(self, ha_address: str, broker_address: str) -> None:
        """Ignored: etcd, not the NameServer, says who the master is."""

    def ha_address(self) -> str:
        return super().ha_address() if self._role != "SLAVE" else ""

    def runtime_info(self) -> dict[str, str]:
        info = super().runtime_info()
        info["haRole"] = self._role
        info["controllerRole"] = self._role
        info["controllerEpoch"] = str(self._epoch)
        status = self._status
        if status is not None:
            info["controllerMaster"] = str(status.master.broker_id) if status.master else ""
            info["controllerSyncSet"] = ",".join(map(str, status.sync_set))
            info["controllerLag"] = ";".join(f"{m.member.broker_id}={m.lag}" for m in status.members)
        tracker = self.in_sync
        if tracker is not None and self._role != "SLAVE":
            info["controllerSyncSet"] = ",".join(map(str, tracker.written))
            info["controllerSyncRequired"] = ",".join(map(str, tracker.required))
        election = self.election
        if election is not None and election.etcd_unconfirmed:
            info["controllerEtcd"] = "unreachable"
        return info

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._retry is not None:
            self._retry.cancel()
        if self._reporter is not None:
            self._reporter.cancel()
        self._listener = None
        if self.election is not None:
            self.election.stop()  # no renewal, no fence timer, not master (the lease is revoked below)
        self._role = "SLAVE"
        super().shutdown()  # also stops the slave metadata copy
        if self.election is not None and self.election.lease:
            # Revoke the lease so the group elects at once (not a TTL later); from a thread of
            # its own, since the broker's loop is stopping.
            lease = self.election.lease
            thread = threading.Thread(target=_revoke, args=(self.copts.etcd, lease), daemon=True)
            thread.start()
            thread.join(self.copts.request_timeout_s * len(self.copts.etcd) + 0.5)

    # ------------------------------------------------------------------ election
    async def _run(self) -> None:
        assert self.election is not None
        while True:
            try:
                await self.election.start()
                break
            except ControllerError as exc:
                log.warning("controller: cannot register in etcd (retrying): %s", exc)
                await asyncio.sleep(RETRY_S)
        while True:
            try:
                async for state in self.election.observe():
                    await self._on_state(state)
            except asyncio.CancelledError:
                raise
            except ControllerError as exc:
                log.warning("controller: watching the group failed (retrying): %s", exc)
            except Exception:
                log.exception("controller: watching the group failed")
            await asyncio.sleep(RETRY_S)

    async def _on_state(self, state: MasterState) -> None:
        assert self.election is not None
        async with self._lock:
            master = state.master
            if master is None:
                if not self.election.is_master:
                    await self._campaign()
            elif master.broker_id == self.broker_id:
                pass  # ours (promoted already), or a dead lease of our previous run: it expires
            else:
                # The leader record carries the epoch it won; the epoch key may be one event late.
                epoch = max(master.epoch, state.epoch)
                if self._following != (epoch, master.broker_id, master.ha_addr):
                    await self._follow(epoch, master)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the loop; finished tasks are dropped (retries may run for days)."""
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.ensure_future(coro))

    def _retry_later(self) -> None:
        """Re-read the group soon: a campaign lost for lag or etcd errors gets no watch event."""
        if self._retry is not None or self.loop is None:
            return

        def fire() -> None:
            self._retry = None
            self._spawn(self._recheck())

        self._retry = self.loop.call_later(max(RETRY_S, self.copts.keepalive_s), fire)

    async def _recheck(self) -> None:
        assert self.election is not None
        try:
            await self._on_state(await self.election.state())
        except ControllerError as exc:
            log.info("controller: reading the group failed: %s", exc)
            self._retry_later()

    async def _campaign(self) -> None:
        assert self.election is not None
        await self._stop_following()
        try:
            history = [EpochEntry(e, s) for e, s in await self.election.history()]
            last = self.epochs.last if self.epochs is not None else None
            if history and (last is None or last.epoch != history[-1].epoch):
                # We never followed the newest master: what we hold past its start is not its
                # data, whatever our offset says.  Cut it, then compete with what is left.
                await self._reconcile(history, f"the log of epoch {history[-1].epoch}")
            end = self.store.get_max_phy_offset()
            result = await self.election.campaign(end)
        except ControllerError as exc:
            log.info("controller: campaign failed: %s", exc)
            self._retry_later()
            return
        if not result.won:
            log.info("controller: broker %d not elected: %s", self.broker_id, result.reason)
            self._retry_later()
            return
        assert self.epochs is not None
        # Entries past our end came from history we never received: the new epoch starts here.
        self.epochs.truncate(end + 1)
        self.epochs.record(result.epoch, end)
        self._epoch = result.epoch
        self._won_sync_set = result.sync_set
        if not self.election.is_master:
            return  # won, but the lease renewal was late: on_resumed serves, or we are deposed
        await self._promote(result.epoch, end)

    async def _promote(self, epoch: int, start: int) -> None:
        assert self.election is not None
        if not await self._serve(start):
            await self.election.resign()
            return
        self._epoch = epoch
        self.failovers += 1
        log.warning(
            "controller: broker %d is %s of epoch %d from offset %d", self.broker_id, self.role, epoch, start
        )
        self._adopt_store_topics()
        self._role = self.role
        self._role_changed()
        # The confirm offset is now the new set's (our start: what we held as a slave was bounded
        # by the old master's): readers held at the old bound re-check (a consumer's held pull or
        # POP would otherwise sleep its whole poll).
        self._confirm_advanced()

    def _adopt_store_topics(self) -> None:
        """Before registering as master: topics the old master created after our last metadata
        sync (up to ``metadata_sync_s`` before it died) but whose messages we hold."""
        if self.metadata is None:
            return
        try:
            for name in self.metadata[0].adopt_store_topics():
                log.warning("controller: new master adopts topic %s from its replicated commit log", name)
        except Exception:
            log.exception("controller: adopting topics from the commit log failed")

    async def _serve(self, start: int = 0) -> bool:
        """Open the HA port (and, under SYNC, the group transfer and the in-sync set)."""
        assert self.election is not None
        self.stop_slave_sync()
        host, port = self._ha_listen
        epoch = self._epoch
        tracker: InSyncTracker | None = None
        transfer: GroupTransfer | None = None
        if self.role == "SYNC_MASTER":
            transfer = GroupTransfer()
            transfer.acked = start  # every new send ends past our start
            members = self._won_sync_set
            if not members:  # resumed after an outage: the set etcd holds (or just us)
                try:
                    current = await self.election.sync_set()
                except ControllerError:
                    current = None
                members = current.brokers if current is not None and current.epoch == epoch else ()
            tracker = InSyncTracker(
                self.broker_id,
                members or (self.broker_id,),
                self.copts,
                self.store,
                transfer,
            )
            tracker.on_confirm = self._confirm_advanced
        try:
            server = await asyncio.to_thread(
                HAServer,
                self.store,
                self.options,
                host,
                port,
                _ignore_ack,
                epoch=epoch,
                on_slave_ack=tracker.on_slave_ack if tracker is not None else None,
                on_newer_epoch=self._on_newer_epoch,
                # The slaves' bound: this set's confirm offset (none with read_uncommitted).
                confirm_offset=(
                    tracker.confirm_offset
                    if tracker is not None and not self.copts.read_uncommitted
                    else None
                ),
            )
        except (OSError, ConfigError) as exc:  # ConfigError: the HA secret file went bad since start
            log.error("controller: cannot serve the HA port %s:%d: %s", host, port, exc)
            if transfer is not None:
                transfer.shutdown()
            return False
        server.start()
        self._fenced_confirm = None
        self.transfer, self.in_sync, self.server = transfer, tracker, server
        if tracker is not None:
            tracker.server = server
            self._reporter = asyncio.ensure_future(tracker.maintain(self.election))
        return True

    def _on_newer_epoch(self, epoch: int) -> None:
        """A slave says it follows a newer epoch than ours (an HA reader thread): ask etcd."""
        loop = self.loop
        if loop is not None:
            loop.call_soon_threadsafe(self._spawn, self._check_deposed(epoch))

    async def _check_deposed(self, epoch: int) -> None:
        # The HA port is unauthenticated: a claimed epoch is a hint, etcd's answer decides.
        election = self.election
        if election is None or not election.is_master:
            return
        log.warning(
            "controller: an HA slave follows epoch %d, newer than ours (%d): checking etcd",
            epoch,
            self._epoch,
        )
        try:
            if await election.verify_leadership():
                log.warning(
                    "controller: etcd says broker %d is still master of epoch %d", self.broker_id, self._epoch
                )
        except ControllerError as exc:
            log.warning("controller: cannot check the claim of epoch %d (etcd unreachable: %s)", epoch, exc)

    def _on_resumed(self, epoch: int) -> None:
        """etcd answers again and the leader key stayed ours: master again, same epoch."""
        self._spawn(self._resume(epoch))

    async def _resume(self, epoch: int) -> None:
        async with self._lock:
            if self.election is None or not self.election.is_master or self.server is not None:
                return
            if await self._serve(self.store.get_max_phy_offset()):
                self._role = self.role
                log.warning("controller: broker %d master again of epoch %d", self.broker_id, epoch)
                self._role_changed()
                self._confirm_advanced()  # the new tracker's bound replaces the fenced one

    def _on_fenced(self, reason: FenceReason) -> None:
        """Deposed or cut off from etcd: refuse acknowledgements now, close the HA port next."""
        tracker = self.in_sync
        if tracker is not None and self._role != "SLAVE":
            # Reads stay at what the set held (the rest may be cut) until we follow a master.
            self._fenced_confirm = tracker.confirm_offset()
        self._role = "SLAVE"
        log.warning("controller: broker %d stops acknowledging as master (%s)", self.broker_id, reason.value)
        self._role_changed()
        self._spawn(self._demote())

    async def _demote(self) -> None:
        server, transfer, reporter = self.server, self.transfer, self._reporter
        self.server = self.transfer = self._reporter = None
        self.in_sync = None
        self._won_sync_set = ()
        if reporter is not None:
            reporter.cancel()
        if server is not None:
            await asyncio.to_thread(server.shutdown)
        if transfer is not None:
            await asyncio.to_thread(transfer.shutdown)  # waiting sends fail (not acknowledged)

    async def _stop_following(self) -> None:
        client = self.client
        if client is not None and client.confirm_offset >= 0 and self._fenced_confirm is None:
            self._fenced_confirm = client.confirm_offset  # still bounded while between masters
        self.client = None
        self._following = None
        self.stop_slave_sync()
        if client is not None:
            await asyncio.to_thread(client.shutdown)

    async def _reconcile(self, history: list[EpochEntry], whose: str) -> None:
        """Cut this log back to where it agrees with ``history`` (etcd's epochs), then adopt them."""
        assert self.epochs is not None
        end = self.store.get_max_phy_offset()
        mine = self.epochs.entries
        if mine:
            # The master's end of its newest epoch is at least our end of it: we got it from it.
            point = consistent_point(mine, end, history, max(end, history[-1].start_offset if history else 0))
            point = 0 if point is None else point
        else:
            point = min(end, history[0].start_offset) if history else end
        if point < end:
            new_end = await asyncio.to_thread(self.store.truncate_commit_log, point)
            log.warning(
                "controller: broker %d truncated its commit log from %d to %d (not on %s)",
                self.broker_id,
                end,
                new_end,
                whose,
            )
            self.epochs.truncate(new_end + 1)
        last = self.epochs.last
        for entry in history:
            if last is None or (entry.epoch > last.epoch and entry.start_offset >= last.start_offset):
                self.epochs.record(entry.epoch, entry.start_offset)
                last = entry

    async def _follow(self, epoch: int, master: Member) -> None:
        """Truncate to where this log agrees with the master of ``epoch``, then stream from it."""
        assert self.election is not None and self.epochs is not None
        if self.server is not None or self._role != "SLAVE":
            tracker = self.in_sync
            if tracker is not None and self._role != "SLAVE":
                self._fenced_confirm = tracker.confirm_offset()
            self._role = "SLAVE"
            self._role_changed()
            await self._demote()
        await self._stop_following()
        try:
            history = [EpochEntry(e, s) for e, s in await self.election.history() if e <= epoch]
        except ControllerError as exc:
            log.info("controller: reading the epoch history failed: %s", exc)
            self._retry_later()
            return
        await self._reconcile(history, f"the master of epoch {epoch}")
        # Cut to the master's log: what is left is its, readable as a slave reads (no bound).
        if self._fenced_confirm is not None:
            self._fenced_confirm = None
            self._confirm_advanced()  # reads held at the fenced bound re-check
        try:
            self.client = HAClient(
                self.store,
                self.options,
                master.ha_addr,
                broker_id=self.broker_id,
                epoch=epoch,
                on_confirm=self._confirm_advanced,
            )
        except ConfigError as exc:  # the HA secret file went bad since start
            log.error("controller: cannot follow broker %d: %s", master.broker_id, exc)
            self._retry_later()
            return
        self.client.start()
        self.master_broker_address = master.addr
        self._following = (epoch, master.broker_id, master.ha_addr)
        changed = self._epoch != epoch
        self._epoch = epoch
        log.info(
            "controller: broker %d follows broker %d (epoch %d) at %s",
            self.broker_id,
            master.broker_id,
            epoch,
            master.ha_addr,
        )
        self.start_slave_sync()
        if changed:
            self._role_changed()

    # ------------------------------------------------------------------ status
    async def _report_loop(self) -> None:
        """Every replica publishes its offset (an ASYNC master's is the group's bound); everyone
        refreshes the status cache."""
        assert self.election is not None
        while True:
            await asyncio.sleep(self.copts.report_s or 1.0)
            try:
                if self.election.lease:
                    # A SYNC master's end is not confirmed anywhere: the in-sync set is the bound.
                    confirm = self._role != "SLAVE" and self.transfer is None
                    await self.election.report(self.store.get_max_phy_offset(), confirm=confirm)
                cluster, name = self.election.prefix.decode().strip("/").split("/")[1:3]
                for group in await cluster_status(self.etcd, cluster, self.election.config.max_lag_bytes):  # type: ignore[arg-type]
                    if group.broker_name == name:
                        self._status = group
            except ControllerError as exc:
                log.debug("controller: report failed: %s", exc)
            except Exception:
                log.exception("controller: report failed")


def _ignore_ack(offset: int) -> None:
    """HAServer's any-slave acknowledgement: unused here (the in-sync set names its slaves)."""


def election_config(options: ControllerOptions, role: str) -> ElectionConfig:
    """The election's timing, lag bound (``max_lag_bytes = -1``: 0 under SYNC, 16 MiB under ASYNC)
    and, under SYNC, the in-sync set (and serving on without etcd, unless ``"never"``)."""
    max_lag = options.max_lag_bytes
    if max_lag < 0:
        max_lag = 0 if role == "SYNC_MASTER" else 16 * 1024 * 1024
    try:
        return ElectionConfig(
            ttl=options.ttl_s,
            keepalive_interval=options.keepalive_s,
            fence_margin=options.fence_margin_s,
            max_lag_bytes=max_lag,
            request_timeout=options.request_timeout_s,
            sync_set=role == "SYNC_MASTER",
            keep_serving=role == "SYNC_MASTER" and options.keep_serving_without_etcd == "in_sync",
        )
    except ValueError as exc:
        raise ConfigError(f"[replication.controller]: {exc}") from None


def _revoke(endpoints: list[str], lease: int) -> None:
    async def revoke() -> None:
        client = EtcdClient(endpoints, 1.0)
        try:
            await client.revoke(lease)
        except ControllerError as exc:
            log.info("controller: revoking the lease failed (it expires by itself): %s", exc)
        finally:
            await client.close()

    try:
        asyncio.run(revoke())
    except Exception:
        log.exception("controller: revoking the lease failed")
