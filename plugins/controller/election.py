"""Master election of one broker group on etcd: leases, a leader key, and a fencing epoch.

Key layout under ``/tidemq/<cluster>/<brokerName>/`` (values are JSON):

- ``members/<brokerId>``: each replica's registration (id, addresses, confirmed commit-log
  offset, last epoch seen), attached to that replica's lease: it disappears when the replica
  stops renewing.
- ``leader``: the master, attached to the master's lease (the same one as its member key).
- ``epoch``: ``{"epoch", "brokerId", "startOffset"}`` of the latest election; no lease, it is
  never deleted, so epochs only grow.
- ``confirmed``: ``{"epoch", "offset"}``: the commit-log offset an ASYNC master reports as
  replicated (and every campaign's start offset); no lease, so it outlives a dead master and
  tells ASYNC candidates how far they must have caught up.
- ``syncset``: ``{"epoch", "brokers"}``: the in-sync replica set of a SYNC group (RocketMQ 5's
  SyncStateSet), master included.  Only the master writes it (guarded by its leader key); a
  SYNC master acknowledges a send only when every other member holds it, so any member holds
  every acknowledged message, and only a member may win a SYNC campaign.

A campaign is one transaction: it succeeds only if no ``leader`` exists and ``epoch``,
``confirmed`` and ``syncset`` are unchanged since the candidate read them (mod revisions), and it
writes the leader key and ``epoch + 1`` together: two winners cannot share an epoch, and a
candidate cannot win on a stale view of the group.

Fencing: the lease is renewed every ``keepalive_interval``; after each successful renewal sent
at time *t*, etcd will not expire the lease before *t + ttl*, and this side stops being master
at *t + ttl - fence_margin* unless a later renewal succeeded.  :attr:`Election.is_master` checks
that deadline itself (a monotonic clock comparison, cheap enough for every acknowledgement), and
``on_fenced`` is called from a timer at the deadline, so a master cut off from etcd stops before
anyone else can be elected.  With ``keep_serving`` (SYNC groups, ``keep_serving_without_etcd =
"in_sync"``) a master that cannot renew is not fenced at the deadline: its in-sync set keeps it
honest (a member stops following it before campaigning, and the set cannot shrink without etcd),
and etcd's answer (lease gone, leader key not ours) still fences it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable

import attrs
import orjson

from tidemq_controller.etcd import Compare, ControllerError, Delete, EtcdClient, KeyValue, Put
from tidemq_controller.records import (
    CampaignResult,
    MasterState,
    Member,
    SyncSet,
    _record,
    group_prefix,
)

log = logging.getLogger(__name__)

__all__ = [
    "CampaignResult",
    "Election",
    "ElectionConfig",
    "FenceReason",
    "MasterState",
    "Member",
    "SyncSet",
    "group_prefix",
]


@attrs.frozen
class ElectionConfig:
    """Lease timing and the eligibility bound.

    ``ttl`` (s, etcd raises it to its minimum, 2 s with default etcd settings) bounds how long a
    dead master keeps the leader key; ``keepalive_interval`` (s) is how often the lease is
    renewed; ``fence_margin`` (s) is how long before the lease can expire on etcd's side a master
    that could not renew stops acknowledging; it must cover an event-loop stall and the time an
    acknowledgement already decided takes to leave, and be at least twice etcd's election timeout
    (an etcd leader cut off from its quorum renews leases until it steps down; see README.md).
    ``max_lag_bytes``: a candidate more than
    this far behind the master's last confirmed offset may not win (the synchronous set).
    """

    ttl: int = 6
    keepalive_interval: float = 1.0
    fence_margin: float = 2.0
    max_lag_bytes: int = 0
    request_timeout: float = 1.0
    #: SYNC groups: elect only members of the in-sync set, and keep serving while etcd is away.
    sync_set: bool = False
    keep_serving: bool = False

    def __attrs_post_init__(self) -> None:
        if self.ttl < 1:
            raise ValueError(f"election ttl {self.ttl}: must be at least 1 s")
        if not 0 < self.fence_margin < self.ttl:
            raise ValueError(
                f"fence margin {self.fence_margin}: must be between 0 and the ttl ({self.ttl} s)"
            )
        if not 0 < self.keepalive_interval < self.ttl - self.fence_margin:
            raise ValueError(
                f"keepalive interval {self.keepalive_interval}: must be below ttl - fence margin "
                f"({self.ttl - self.fence_margin} s), or one late renewal fences the master"
            )
        if self.max_lag_bytes < 0:
            raise ValueError(f"max lag {self.max_lag_bytes}: must be >= 0")


class FenceReason(enum.Enum):
    """Why a master stopped being master."""

    #: etcd says the lease is gone (expired, revoked) or another replica holds the leader key:
    #: deposed for certain; follow the new master after truncating.
    LEASE_LOST = "lease_lost"
    #: No renewal got through before the deadline: etcd is down or this side is cut off from it;
    #: another replica may be elected.  Mastership comes back (``on_resumed``) if etcd answers
    #: again while the lease and the leader key are still this replica's.
    ETCD_UNREACHABLE = "etcd_unreachable"


class Election:
    """One replica's part in its group's election.

    :meth:`start` registers it (a lease and its member key); :meth:`campaign` tries to become
    master; :meth:`report` publishes its confirmed offset; :meth:`resign` gives mastership up;
    :meth:`observe` follows the master.  ``on_fenced(reason)`` is called when a master stops
    being one without resigning, ``on_resumed(epoch)`` when it is master again on the same lease
    and epoch after etcd came back.  Callbacks run on the event loop and must not block.
    """

    def __init__(
        self,
        client: EtcdClient,
        cluster: str,
        broker_name: str,
        me: Member,
        config: ElectionConfig | None = None,
        on_fenced: Callable[[FenceReason], None] | None = None,
        on_resumed: Callable[[int], None] | None = None,
    ) -> None:
        self.client = client
        self.config = config or ElectionConfig()
        self.prefix = group_prefix(cluster, broker_name)
        self.me = me
        self.on_fenced = on_fenced
        self.on_resumed = on_resumed
        self.lease = 0
        self.epoch = 0  # the epoch this replica won last (0: never master)
        self._master = False
        self._leader_revision = 0  # create revision of our leader key: proof it is still ours
        #: time.monotonic() before which etcd cannot have expired our lease (minus the margin);
        #: monotonic, not the loop's clock, so any thread can read is_master.
        self._deadline = 0.0
        self._fence_timer: asyncio.TimerHandle | None = None
        self._keepalive_task: asyncio.Task[None] | None = None
        self._fenced_unreachable = False
        self._registered = False

    # -- keys

    @property
    def _leader_key(self) -> bytes:
        return self.prefix + b"leader"

    @property
    def _epoch_key(self) -> bytes:
        return self.prefix + b"epoch"

    @property
    def _confirmed_key(self) -> bytes:
        return self.prefix + b"confirmed"

    @property
    def _sync_set_key(self) -> bytes:
        return self.prefix + b"syncset"

    def _member_key(self, broker_id: int) -> bytes:
        return self.prefix + b"members/%d" % broker_id

    def _history_key(self, epoch: int) -> bytes:
        return self.prefix + b"history/%d" % epoch

    # -- life cycle

    async def start(self) -> None:
        """Grant the lease, register this replica, and start renewing."""
        await self._register()
        self._keepalive_task = asyncio.get_running_loop().create_task(self._keepalive_loop())

    async def _register(self) -> None:
        sent = time.monotonic()
        self.lease, ttl = await self.client.grant(self.config.ttl)
        self._renewed(sent, ttl)
        self._registered = False  # a failed put is retried by the renewal loop
        await self.client.put(self._member_key(self.me.broker_id), self.me.to_json(), self.lease)
        self._registered = True

    def stop(self) -> None:
        """Stop renewing and fencing, and stop being master, now (no etcd request: the lease expires,
        or :meth:`close` revokes it)."""
        if self._keepalive_task is not None:
            self._keepalive_task.cancel()
            self._keepalive_task = None
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        self._master = False

    async def close(self, revoke: bool = True) -> None:
        """Stop renewing; with ``revoke`` delete the registration (and the leader key) at once."""
        self.stop()
        if revoke and self.lease:
            try:
                await self.client.revoke(self.lease)
            except ControllerError as exc:
                log.warning("leaving the election: %s (the lease expires in %d s)", exc, self.config.ttl)

    @property
    def is_master(self) -> bool:
        """Master, and the lease certainly still alive on etcd's side (minus the margin).

        With ``keep_serving``, master until etcd says otherwise (the in-sync set fences instead).
        """
        return self._master and (self.config.keep_serving or time.monotonic() < self._deadline)

    @property
    def etcd_unconfirmed(self) -> bool:
        """A master serving past its fencing deadline (``keep_serving``: etcd unreachable)."""
        return self._master and time.monotonic() >= self._deadline

    def stand_down(self) -> None:
        """Stop being master as if fenced for an unreachable etcd (mastership resumes when etcd
        answers and the leader key is still ours): for a master serving without etcd that lost
        what made that safe."""
        self._fence(FenceReason.ETCD_UNREACHABLE)

    async def verify_leadership(self) -> bool:
        """Ask etcd whether the leader key is still ours; fence (LEASE_LOST) when it is not.

        For hints that arrive from outside etcd (a slave claiming a newer epoch on the HA port,
        which anyone can reach): only etcd's answer deposes.  Raises :class:`ControllerError`
        when etcd cannot be reached.
        """
        if not self._master:
            return False
        kvs, _ = await self.client.get(self._leader_key)
        if bool(kvs) and kvs[0].create_revision == self._leader_revision and kvs[0].lease == self.lease:
            return True
        self._fenced_unreachable = False
        self._fence(FenceReason.LEASE_LOST)
        return False

    # -- lease renewal and fencing

    def _renewed(self, sent: float, ttl: int) -> None:
        """A renewal sent at ``sent`` (monotonic) got ``ttl``: move the fencing deadline."""
        self._deadline = sent + ttl - self.config.fence_margin
        if self._fence_timer is not None:
            self._fence_timer.cancel()
        delay = max(0.0, self._deadline - time.monotonic())
        self._fence_timer = asyncio.get_running_loop().call_later(delay, self._fence_if_due)

    def _fence_if_due(self) -> None:
        if time.monotonic() >= self._deadline:
            if self.config.keep_serving:
                if self._master:
                    log.warning(
                        "broker %d cannot renew its lease: serving on as master of epoch %d under its "
                        "in-sync set until etcd answers",
                        self.me.broker_id,
                        self.epoch,
                    )
                return
            self._fence(FenceReason.ETCD_UNREACHABLE)
        else:  # the timer ran early (clock granularity): look again at the deadline
            delay = self._deadline - time.monotonic()
            self._fence_timer = asyncio.get_running_loop().call_later(delay, self._fence_if_due)

    def _fence(self, reason: FenceReason) -> None:
        if not self._master:
            return
        self._master = False
        self._fenced_unreachable = reason is FenceReason.ETCD_UNREACHABLE
        log.warning("broker %d no longer master of epoch %d: %s", self.me.broker_id, self.epoch, reason.value)
        if self.on_fenced is not None:
            self.on_fenced(reason)

    async def _keepalive_loop(self) -> None:
        while True:
            sent = time.monotonic()
            try:
                ttl = await self.client.keepalive(self.lease, self.config.request_timeout)
                if ttl <= 0:
                    self._fence(FenceReason.LEASE_LOST)
                    self._fenced_unreachable = False
                    log.warning("lease of broker %d expired; registering again", self.me.broker_id)
                    await self._register()
                else:
                    self._renewed(sent, ttl)
                    if not self._registered:
                        await self.client.put(
                            self._member_key(self.me.broker_id), self.me.to_json(), self.lease
                        )
                        self._registered = True
                    if self._master or self._fenced_unreachable:
                        await self._check_leader()
            except ControllerError as exc:
                log.debug("lease renewal failed: %s", exc)
            except Exception:
                # Never let the loop die: without it the lease lapses and the replica drops out.
                log.exception("lease renewal of broker %d failed", self.me.broker_id)
            await asyncio.sleep(max(0.0, sent + self.config.keepalive_interval - time.monotonic()))

    async def _check_leader(self) -> None:
        """After a renewal: still holding the leader key? Resume after an outage, fence if not."""
        kvs, _ = await self.client.get(self._leader_key)
        ours = bool(kvs) and kvs[0].create_revision == self._leader_revision and kvs[0].lease == self.lease
        if not ours:
            self._fenced_unreachable = False
            self._fence(FenceReason.LEASE_LOST)
        elif self._fenced_unreachable and not self._master:
            # Our lease never lapsed and the key is still ours: nobody else was elected meanwhile.
            self._fenced_unreachable = False
            self._master = True
            log.warning("broker %d master again of epoch %d (etcd reachable)", self.me.broker_id, self.epoch)
            if self.on_resumed is not None:
                self.on_resumed(self.epoch)

    # -- the election

    async def state(self) -> MasterState:
        """The current master and epoch."""
        kvs, _ = await self.client.get(self.prefix, prefix=True)
        by_key = {kv.key: kv for kv in kvs}
        return self._state(by_key.get(self._leader_key), by_key.get(self._epoch_key))

    def _state(self, leader: KeyValue | None, epoch: KeyValue | None) -> MasterState:
        master = Member.from_json(leader.value) if leader is not None else None
        return MasterState(master, int(_record(epoch).get("epoch", 0)))

    async def members(self) -> list[Member]:
        """The registered replicas, by broker id."""
        kvs, _ = await self.client.get(self.prefix + b"members/", prefix=True)
        return sorted((Member.from_json(kv.value) for kv in kvs), key=lambda m: m.broker_id)

    async def history(self) -> list[tuple[int, int]]:
        """Every election's ``(epoch, start offset)``, oldest first (written by each campaign)."""
        kvs, _ = await self.client.get(self.prefix + b"history/", prefix=True)
        entries = []
        for kv in kvs:
            raw = _record(kv)
            try:
                entries.append((int(raw["epoch"]), int(raw["startOffset"])))
            except (KeyError, TypeError, ValueError):
                raise ControllerError(
                    f"unreadable history record {kv.key.decode(errors='replace')} in etcd"
                ) from None
        return sorted(entries)

    async def sync_set(self) -> SyncSet | None:
        """The group's in-sync set in etcd (None: never written, e.g. before the first election)."""
        kvs, _ = await self.client.get(self._sync_set_key)
        return SyncSet.from_kv(kvs[0] if kvs else None)

    async def update_sync_set(self, brokers: tuple[int, ...]) -> bool:
        """As master, write the in-sync set; False (and fenced) when the leader key is not ours."""
        if not self._leader_revision:
            return False
        record = SyncSet(self.epoch, tuple(sorted(set(brokers))))
        held = Compare(self._leader_key, "CREATE", self._leader_revision)
        result = await self.client.txn([held], [Put(self._sync_set_key, record.to_json())])
        if not result.succeeded:
            self._fence(FenceReason.LEASE_LOST)
            return False
        log.info(
            "broker %d: in-sync set of epoch %d is now %s",
            self.me.broker_id,
            self.epoch,
            list(record.brokers),
        )
        return True

    async def confirmed_offset(self) -> int:
        """The last master's confirmed offset (what a candidate must have caught up to)."""
        kvs, _ = await self.client.get(self._confirmed_key)
        return int(_record(kvs[0] if kvs else None).get("offset", 0))

    async def campaign(self, offset: int) -> CampaignResult:
        """Try to become master with the commit log confirmed up to ``offset``.

        Loses when a master exists, when another candidate's transaction got in first, and:
        with ``sync_set`` (SYNC groups) when this replica is not in the group's in-sync set
        (once one exists); otherwise when ``offset`` is more than ``max_lag_bytes`` behind the
        last master's confirmed offset.  The winner of a SYNC group starts with the old set
        minus the old master.  Raises :class:`ControllerError` when etcd cannot be reached (no
        election without it).
        """
        if not self.lease:
            raise ControllerError("campaign before start(): this replica is not registered")
        kvs, _ = await self.client.get(self.prefix, prefix=True)
        by_key = {kv.key: kv for kv in kvs}
        epoch_kv, confirmed_kv = by_key.get(self._epoch_key), by_key.get(self._confirmed_key)
        sync_kv = by_key.get(self._sync_set_key)
        current = self._state(by_key.get(self._leader_key), epoch_kv)
        if current.master is not None:
            return CampaignResult(False, current.epoch, f"broker {current.master.broker_id} is master")
        confirmed = int(_record(confirmed_kv).get("offset", 0))
        in_sync = SyncSet.from_kv(sync_kv) if self.config.sync_set else None
        new_set: tuple[int, ...] = ()
        if in_sync is not None:
            if self.me.broker_id not in in_sync.brokers:
                return CampaignResult(
                    False,
                    current.epoch,
                    f"not in the in-sync set {list(in_sync.brokers)} of epoch {in_sync.epoch}",
                )
            old_master = int(_record(epoch_kv).get("brokerId", -1))
            new_set = tuple(b for b in in_sync.brokers if b != old_master or b == self.me.broker_id)
        elif self.config.sync_set:
            new_set = (self.me.broker_id,)
        if in_sync is None and confirmed - offset > self.config.max_lag_bytes:
            return CampaignResult(
                False,
                current.epoch,
                f"offset {offset} is {confirmed - offset} bytes behind the confirmed {confirmed} "
                f"(max lag {self.config.max_lag_bytes})",
            )
        epoch = current.epoch + 1
        me = attrs.evolve(self.me, offset=offset, epoch=epoch)
        record = orjson.dumps({"epoch": epoch, "brokerId": me.broker_id, "startOffset": offset})
        compare = [
            Compare(self._leader_key, "CREATE", 0),
            Compare(self._epoch_key, "MOD", epoch_kv.mod_revision if epoch_kv else 0),
            Compare(self._confirmed_key, "MOD", confirmed_kv.mod_revision if confirmed_kv else 0),
            Compare(self._sync_set_key, "MOD", sync_kv.mod_revision if sync_kv else 0),
            Compare(self._member_key(me.broker_id), "VALUE", self.me.to_json()),  # still registered
        ]
        success = [
            Put(self._leader_key, me.to_json(), self.lease),
            Put(self._epoch_key, record),
            Put(self._confirmed_key, orjson.dumps({"epoch": epoch, "offset": offset})),
            Put(self._member_key(me.broker_id), me.to_json(), self.lease),
            # No lease, never deleted: the epoch history a returning replica truncates against.
            Put(self._history_key(epoch), record),
        ]
        if self.config.sync_set:
            success.append(Put(self._sync_set_key, SyncSet(epoch, new_set).to_json()))
        sent = time.monotonic()
        result = await self.client.txn(compare, success)
        if not result.succeeded:
            return CampaignResult(False, current.epoch, "another candidate changed the group first")
        self.me, self.epoch, self._leader_revision = me, epoch, result.revision
        # Only as master while the lease renewed before the campaign is still certainly alive.
        self._master = sent < self._deadline
        self._fenced_unreachable = not self._master  # resumes once a renewal gets through
        log.info("broker %d elected master of epoch %d at offset %d", me.broker_id, epoch, offset)
        return CampaignResult(True, epoch, sync_set=new_set)

    async def report(self, offset: int, confirm: bool = True) -> None:
        """Publish this replica's offset; a master's also becomes the group's bound (``confirm``)."""
        me = attrs.evolve(self.me, offset=offset)
        member = Put(self._member_key(me.broker_id), me.to_json(), self.lease)
        if self._master and confirm:
            confirmed = Put(self._confirmed_key, orjson.dumps({"epoch": self.epoch, "offset": offset}))
            # Only while the leader key is still ours: a deposed master cannot move the bound.
            held = Compare(self._leader_key, "CREATE", self._leader_revision)
            result = await self.client.txn([held], [member, confirmed])
            if not result.succeeded:
                self._fence(FenceReason.LEASE_LOST)
                return
        else:
            await self.client.put(member.key, member.value, self.lease)
        self.me = me

    async def resign(self) -> None:
        """Give mastership up (delete the leader key if still ours); the epoch stays.

        Also after a fence for an unreachable etcd: the key may still be ours, and keeping it
        would block the election until the lease ends.
        """
        if not self._leader_revision:
            return
        self._master = self._fenced_unreachable = False
        held = Compare(self._leader_key, "CREATE", self._leader_revision)
        self._leader_revision = 0
        await self.client.txn([held], [Delete(self._leader_key)])
        log.info("broker %d resigned as master of epoch %d", self.me.broker_id, self.epoch)

    async def observe(self) -> AsyncIterator[MasterState]:
        """The group's state now, then again after every change of master or epoch."""
        kvs, revision = await self.client.get(self.prefix, prefix=True)
        by_key = {kv.key: kv for kv in kvs if kv.key in (self._leader_key, self._epoch_key)}
        last = self._state(by_key.get(self._leader_key), by_key.get(self._epoch_key))
        yield last
        # A quiet group re-opens its watch every 2 ttl: a half-open stream is noticed that fast.
        idle = max(5.0, 2.0 * self.config.ttl)
        watch = self.client.watch(self.prefix, prefix=True, start_revision=revision + 1, idle_timeout=idle)
        async for event in watch:
            if event.kv.key not in (self._leader_key, self._epoch_key):
                continue
            by_key[event.kv.key] = event.kv
            if event.type == "DELETE":
                del by_key[event.kv.key]
            state = self._state(by_key.get(self._leader_key), by_key.get(self._epoch_key))
            if state != last:
                last = state
                yield state
