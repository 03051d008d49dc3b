"""What ``tidemq admin`` shows of controller mode: each group's master, epoch, synchronous set and lag.

Read in one etcd range over ``/tidemq/<cluster>/``; no lease, nothing written.  Lags are computed
from the offsets the replicas last reported (:meth:`Election.report`), against the master's (or
the confirmed offset, whichever is further): as fresh as the report period.  A SYNC group's
in-sync set is the ``syncset`` key its master maintains; an ASYNC group's is every replica
within the lag bound.
"""

from __future__ import annotations

from collections import defaultdict

import attrs

from tidemq_controller.etcd import EtcdClient, KeyValue
from tidemq_controller.records import Member, SyncSet, _record, group_prefix

__all__ = ["GroupStatus", "MemberStatus", "cluster_status"]


@attrs.frozen
class MemberStatus:
    """One registered replica: how far behind the confirmed offset, and whether it may be elected."""

    member: Member
    lag: int
    in_sync: bool
    master: bool


@attrs.frozen
class GroupStatus:
    """One broker group in etcd."""

    broker_name: str
    master: Member | None
    epoch: int
    confirmed: int
    members: tuple[MemberStatus, ...]
    #: The SYNC group's in-sync set from etcd (None: an ASYNC group, or none written yet).
    in_sync_set: SyncSet | None = None

    @property
    def sync_set(self) -> tuple[int, ...]:
        """Broker ids that may be elected: the in-sync set, or those within the lag bound."""
        if self.in_sync_set is not None:
            return self.in_sync_set.brokers
        return tuple(m.member.broker_id for m in self.members if m.in_sync)


async def cluster_status(client: EtcdClient, cluster: str, max_lag_bytes: int = 0) -> list[GroupStatus]:
    """Every group of ``cluster`` registered in etcd, by broker name."""
    group_prefix(cluster, "any")  # the same check of the cluster name
    prefix = f"/tidemq/{cluster}/".encode()
    kvs, _ = await client.get(prefix, prefix=True)
    groups: dict[str, dict[bytes, KeyValue]] = defaultdict(dict)
    for kv in kvs:
        name, _, rest = kv.key[len(prefix) :].partition(b"/")
        groups[name.decode(errors="replace")][rest] = kv
    return [_group(name, keys, max_lag_bytes) for name, keys in sorted(groups.items())]


def _group(name: str, keys: dict[bytes, KeyValue], max_lag_bytes: int) -> GroupStatus:
    leader = keys.get(b"leader")
    master = Member.from_json(leader.value) if leader is not None else None
    epoch = int(_record(keys.get(b"epoch")).get("epoch", 0))
    confirmed = int(_record(keys.get(b"confirmed")).get("offset", 0))
    in_sync_set = SyncSet.from_kv(keys.get(b"syncset"))
    registered = [
        Member.from_json(kv.value) for key, kv in sorted(keys.items()) if key.startswith(b"members/")
    ]
    head = confirmed
    for member in registered:
        if master is not None and master.broker_id == member.broker_id:
            head = max(head, member.offset)
    members = []
    for member in registered:
        is_master = master is not None and master.broker_id == member.broker_id
        lag = 0 if is_master else max(0, head - member.offset)
        if in_sync_set is not None:
            in_sync = member.broker_id in in_sync_set.brokers
        else:
            in_sync = lag <= max_lag_bytes
        members.append(MemberStatus(member, lag, in_sync, is_master))
    members.sort(key=lambda m: m.member.broker_id)
    return GroupStatus(name, master, epoch, confirmed, tuple(members), in_sync_set)
